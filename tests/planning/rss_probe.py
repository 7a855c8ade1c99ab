"""Run as a script: the kernel's peak RSS growth of one real training step (two iterations, as the simulator's) of a
MONAI 3D DenseNet-121 on a patch, or of PointPillars on a frame's pillars, printed as JSON. The independent
measurement the planner's simulated peak is held to (tests/planning/test_plan_volumes.py, test_plan_pillars.py).

    python tests/planning/rss_probe.py SIZE BATCH             # the DenseNet on SIZE^3 patches
    python tests/planning/rss_probe.py pillars VOXELS BATCH   # PointPillars with max_voxels VOXELS

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


PILLARS_MODEL = ModelConfig(name="pointpillars")  # its default widths (OpenPCDet's KITTI model)
PILLARS_RANGE = (0.0, -25.6, -3.0, 51.2, 25.6, 1.0)  # a 320 x 320 grid of 0.16 m pillars


def pillars(max_voxels: int, points: int = 32) -> DataInfo:
    return DataInfo("detection3d", "pointcloud", (max_voxels, points, 4), "float32", 3, ("Car", "Pedestrian", "Cyclist"),
                    pillar_grid=(*PILLARS_RANGE, 0.16, 0.16, 4.0, points, max_voxels, max_voxels))


def status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    if sys.argv[1] == "pillars":
        model, info, batch = PILLARS_MODEL, pillars(int(sys.argv[2])), int(sys.argv[3])
        warm = pillars(1000)
    else:
        model, info, batch = MODEL, volumes(int(sys.argv[1])), int(sys.argv[2])
        warm = volumes(32)
    torch.set_num_threads(1)
    measure_real_step(model, OPTIM, warm, micro_batch_size=2)  # warm-up
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS starts again from here
    before = status_bytes("VmRSS")
    measure_real_step(model, OPTIM, info, micro_batch_size=batch)
    print(json.dumps({"rss_growth_bytes": status_bytes("VmHWM") - before}))


if __name__ == "__main__":
    main()
