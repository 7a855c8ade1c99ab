"""Start-up of `trainforge train` on a JPEG folder, first and second run, against a run on the built-in digits.

    .venv/bin/python benchmarks/data_startup.py --images 20000 --size 256          # about 2 minutes on 2 vCPUs
    .venv/bin/python benchmarks/data_startup.py --images 2000 --json

Generates `--images` JPEGs (benchmarks/data_throughput.py's `make_folder`, seeded) in a temporary folder and runs
`python -m trainforge train` three times, each a 1-step run of a small MLP on the CPU (1% validation and test, so
the final evaluation stays small): on the digits, then twice on the folder with one fresh TRAINFORGE_HOME (the
first run scans the folder and writes its manifest, the second reuses it). Start-up is the time from starting the
process to the data summary line on stderr (printed once data, model and setup are ready, before the first step);
the overhead of a folder run is its start-up minus the digits run's. `ratio`: second-run overhead / 5 s (the
goal is <= 1). Always exits 0.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL_SECOND_OVERHEAD_S = 5.0
GOAL_FIRST_OVERHEAD_S = 30.0
COMMON = ["model.name=mlp", "model.args={hidden: [16]}", "train.device=cpu", "train.max_steps=1",
          "train.global_batch_size=32", "train.micro_batch_size=32", "train.early_stopping=null",
          "data.val_fraction=0.01", "data.test_fraction=0.01", "log.progress=false", "log.tensorboard=false"]


def timed_run(args: list[str], run_dir: Path, env: dict[str, str]) -> dict[str, float]:
    """Seconds to the data summary line and to the end of the process."""
    cmd = [sys.executable, "-m", "trainforge", "train", *COMMON, *args, "--run-dir", str(run_dir)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    ready = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if ready is None and line.startswith("data: ") and " rows read" in line:
            ready = time.perf_counter() - start
        log("  | " + line.rstrip())
    rc = proc.wait()
    total = time.perf_counter() - start
    if rc != 0 or ready is None:
        raise SystemExit(f"trainforge train failed (exit {rc}): {' '.join(cmd)}")
    return {"startup_s": ready, "total_s": total}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    spec = importlib.util.spec_from_file_location("data_throughput", Path(__file__).with_name("data_throughput.py"))
    throughput = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(throughput)
    with tempfile.TemporaryDirectory(prefix="data_startup-") as tmp:
        root, home = Path(tmp) / "images", Path(tmp) / "home"
        t0 = time.perf_counter()
        throughput.make_folder(root, images=a.images, size=a.size, classes=a.classes, seed=a.seed)
        log(f"generated {a.images:,} JPEGs of {a.size}x{a.size} in {time.perf_counter() - t0:.1f} s")
        env = dict(os.environ, TRAINFORGE_HOME=str(home))
        folder = ["data.source=imagefolder", f"data.path={root}", "data.args={image_size: 32}"]
        log("digits:")
        digits = timed_run([], Path(tmp) / "digits", env)
        log("folder, first run:")
        first = timed_run(folder, Path(tmp) / "first", env)
        log("folder, second run:")
        second = timed_run(folder, Path(tmp) / "second", env)
    result = {
        "benchmark": "data_startup",
        "ratio": (second["startup_s"] - digits["startup_s"]) / GOAL_SECOND_OVERHEAD_S,
        "overhead_s": {"first": first["startup_s"] - digits["startup_s"],
                       "second": second["startup_s"] - digits["startup_s"]},
        "goal_overhead_s": {"first": GOAL_FIRST_OVERHEAD_S, "second": GOAL_SECOND_OVERHEAD_S},
        "runs": {"digits": digits, "first": first, "second": second},
        "setup": {"images": a.images, "size": a.size, "classes": a.classes, "seed": a.seed, "image_size": 32},
        "machine": {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                    "processor": platform.processor() or platform.machine(), "python": platform.python_version()},
        "date": datetime.date.today().isoformat(),
    }
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        o = result["overhead_s"]
        print(f"start-up to the data line: digits {digits['startup_s']:.1f} s, folder of {a.images:,} JPEGs first "
              f"{first['startup_s']:.1f} s (+{o['first']:.1f} s, goal <= {GOAL_FIRST_OVERHEAD_S:.0f}), second "
              f"{second['startup_s']:.1f} s (+{o['second']:.1f} s, goal <= {GOAL_SECOND_OVERHEAD_S:.0f})")
    return 0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
