"""`trainforge plan RECIPE --calibrate`: run a few real steps here, compare with the prediction, and store
the correction so later plans for this device use it.

The factors file (where, what, read, write) is `planning.calibration_store`, which the planner reads
without importing this module: this one runs real steps through the training loop.
"""
from __future__ import annotations

import gc
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from trainforge.config import apply_overrides, config_from_dict
from trainforge.hardware.catalog import load_catalog
from trainforge.hardware.device import resolve_device
from trainforge.metrics_file import read_metrics
from trainforge.planning.calibration_store import save_calibration
from trainforge.planning.plan import plan_local_step
from trainforge.training.run import run
from trainforge.training.setup import RunSetup
from trainforge.layout import RunDir

MEASURED_STEPS = 8
WARMUP_STEPS = 3


@dataclass(frozen=True)
class MeasuredRun:
    """A few real optimizer steps of a recipe on this machine's device, through the training loop."""

    setup: RunSetup  # what the run resolved: the prediction is made for exactly that
    step_time_s: float  # median over the steps after the warm-up (data wait included)
    samples_per_s: float  # median, likewise
    data_wait_frac: float  # median share of the step spent waiting for the next batch
    reserved_bytes: Optional[int]  # CUDA: torch.cuda.max_memory_reserved over the run; None on the CPU
    allocated_bytes: Optional[int]  # CUDA: torch.cuda.max_memory_allocated over the run
    wall_s: float  # the whole run: data, model, steps, checkpoint, evaluation


def measure_steps(cfg, *, steps: int = MEASURED_STEPS, warmup: int = WARMUP_STEPS) -> MeasuredRun:
    """Run `warmup + steps` optimizer steps of `cfg` in a temporary run directory and measure them."""
    device = resolve_device(cfg.train.device)
    total = warmup + steps
    short = config_from_dict(apply_overrides(cfg.model_dump(mode="json"), [
        f"train.max_steps={total}", "train.log_every_steps=1", f"train.eval_every_steps={total}",
        f"train.checkpoint_every_steps={total}", "train.early_stopping=null", "log.progress=false",
        "log.tensorboard=false", "log.report=false",  # the run directory is deleted at once: no plots for nobody
    ]))
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()  # an earlier run's cached blocks would count as this one's reserved memory
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory(prefix="trainforge-measure-") as tmp:
        start = time.perf_counter()
        measured = RunDir(Path(tmp) / "measured")
        result = run(short, measured.path)
        wall_s = time.perf_counter() - start
        rows = [r for r in read_metrics(measured.metrics) if r["split"] == "train"][warmup:]
    cuda = device.type == "cuda"
    return MeasuredRun(
        setup=result.setup,
        step_time_s=statistics.median(r["step_time_s"] for r in rows),
        samples_per_s=statistics.median(r["samples_per_s"] for r in rows),
        data_wait_frac=statistics.median(r.get("data_wait_frac") or 0.0 for r in rows),
        reserved_bytes=int(torch.cuda.max_memory_reserved(device)) if cuda else None,
        allocated_bytes=int(torch.cuda.max_memory_allocated(device)) if cuda else None,
        wall_s=wall_s,
    )


def predict_measured(cfg, measured: MeasuredRun, *, catalog=None, calibration: Optional[dict] = None):
    """The planner's prediction for the setup `measured` ran (device, micro-batch, precision, activation
    checkpointing); `calibration` as `plan_local_step` takes it ({} for none, None for the stored factors)."""
    ran = measured.setup
    return plan_local_step(cfg, ran.device, catalog or load_catalog(), micro_batch_size=ran.micro_batch_size,
                           precision=ran.precision, calibration=calibration,
                           activation_checkpointing=ran.activation_checkpointing)


def calibrate(cfg, *, catalog=None, steps: int = MEASURED_STEPS) -> dict[str, Any]:
    """Measure `steps` real optimizer steps of `cfg` on its device; return and store predicted vs measured."""
    measured = measure_steps(cfg, steps=steps)
    predicted = predict_measured(cfg, measured, catalog=catalog, calibration={})
    entry: dict[str, Any] = {
        "recipe": cfg.name,
        "date": time.strftime("%Y-%m-%d"),
        "device": predicted.gpu,
        "micro_batch_size": measured.setup.micro_batch_size,
        "precision": predicted.precision,
        "predicted_step_time_s": predicted.step_time_s,
        "measured_step_time_s": measured.step_time_s,
        "time_factor": measured.step_time_s / predicted.step_time_s,
        "predicted_peak_bytes": predicted.peak_bytes_per_gpu,
        "simulated_peak_bytes": predicted.simulated_peak_bytes_per_gpu,
        "measured_peak_bytes": measured.reserved_bytes,
        "wall_s": measured.wall_s,
    }
    if measured.reserved_bytes is not None:
        entry["memory_factor"] = measured.reserved_bytes / predicted.simulated_peak_bytes_per_gpu
    entry["stored_in"] = str(save_calibration(predicted.gpu, entry))
    return entry
