"""Run as a script: the kernel's peak RSS growth of one real training step (two iterations, as the simulator's) of a
MONAI 3D DenseNet-121 on a patch, printed as JSON. The independent measurement the planner's simulated peak is held
to (tests/planning/test_plan_volumes.py).

    python tests/planning/rss_probe.py SIZE BATCH

A warm-up step on a small patch first loads the kernels' code and the allocator's arenas; then the kernel's peak
RSS (VmHWM) is reset (`/proc/self/clear_refs` 5) and measured over the step from the RSS before it. Run with
MALLOC_MMAP_THRESHOLD_ set: glibc then maps every large block and unmaps it when freed, so RSS follows the memory
the step holds (by default glibc raises that threshold as blocks are freed and keeps them, and RSS shows the
allocator's retention instead)."""
from __future__ import annotations

import gc
import json
import sys

import torch

from trainforge.config import ModelConfig, OptimConfig
from trainforge.data.base import DataInfo
from trainforge.planning.simulate import measure_real_step

MODEL = ModelConfig(name="monai", args={"arch": "DenseNet121"})
OPTIM = OptimConfig(name="adamw", weight_decay=0.1)


def volumes(size: int) -> DataInfo:
    return DataInfo("classification", "volume", (1, size, size, size), "float32", 2, ("a", "b"))


def status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    size, batch = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    measure_real_step(MODEL, OPTIM, volumes(32), micro_batch_size=2)  # warm-up
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS starts again from here
    before = status_bytes("VmRSS")
    measure_real_step(MODEL, OPTIM, volumes(size), micro_batch_size=batch)
    print(json.dumps({"rss_growth_bytes": status_bytes("VmHWM") - before}))


if __name__ == "__main__":
    main()
