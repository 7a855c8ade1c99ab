"""`trainforge plan RECIPE --calibrate`: run a few real steps here, compare with the prediction, and store
the correction so later plans for this device use it.

The factors file (where, what, read, write) is `planning.calibration_store`, which the planner reads
without importing this module: this one runs real steps through the training loop.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from trainforge.config import apply_overrides, config_from_dict
from trainforge.hardware.catalog import load_catalog
from trainforge.hardware.device import resolve_device
from trainforge.metrics_file import read_metrics
from trainforge.planning.calibration_store import save_calibration
from trainforge.planning.plan import plan_local_step
from trainforge.training.run import run

MEASURED_STEPS = 8
WARMUP_STEPS = 3


def calibrate(cfg, *, catalog=None, steps: int = MEASURED_STEPS) -> dict[str, Any]:
    """Measure `steps` real optimizer steps of `cfg` on its device; return and store predicted vs measured."""
    catalog = catalog or load_catalog()
    device = resolve_device(cfg.train.device)
    total = WARMUP_STEPS + steps
    short = config_from_dict(apply_overrides(cfg.model_dump(mode="json"), [
        f"train.max_steps={total}", "train.log_every_steps=1", f"train.eval_every_steps={total}",
        f"train.checkpoint_every_steps={total}", "train.early_stopping=null", "log.progress=false",
        "log.tensorboard=false",
    ]))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory(prefix="trainforge-calibrate-") as tmp:
        start = time.perf_counter()
        result = run(short, Path(tmp) / "run")
        wall_s = time.perf_counter() - start
        rows = [r for r in read_metrics(Path(tmp) / "run" / "metrics.jsonl") if r["split"] == "train"]
    measured_step_s = statistics.median(r["step_time_s"] for r in rows[WARMUP_STEPS:])
    ran = result.setup  # the setup the measured run resolved: the prediction is made for exactly that
    predicted = plan_local_step(short, ran.device, catalog, micro_batch_size=ran.micro_batch_size,
                                precision=ran.precision, calibration={})
    entry: dict[str, Any] = {
        "recipe": cfg.name,
        "date": time.strftime("%Y-%m-%d"),
        "device": predicted.gpu,
        "micro_batch_size": ran.micro_batch_size,
        "precision": predicted.precision,
        "predicted_step_time_s": predicted.step_time_s,
        "measured_step_time_s": measured_step_s,
        "time_factor": measured_step_s / predicted.step_time_s,
        "predicted_peak_bytes": predicted.peak_bytes_per_gpu,
        "simulated_peak_bytes": predicted.simulated_peak_bytes_per_gpu,
        "measured_peak_bytes": None,
        "wall_s": wall_s,
    }
    if device.type == "cuda":
        reserved = int(torch.cuda.max_memory_reserved(device))
        entry["measured_peak_bytes"] = reserved
        entry["memory_factor"] = reserved / predicted.simulated_peak_bytes_per_gpu
    entry["stored_in"] = str(save_calibration(predicted.gpu, entry))
    return entry

