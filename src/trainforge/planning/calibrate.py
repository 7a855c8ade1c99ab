"""`trainforge plan RECIPE --calibrate`: run a few real steps here, compare with the prediction, and store
the correction so later plans for this device use it.

Stored per device (the catalog name of the local GPU, or "cpu") in `$TRAINFORGE_HOME/calibration.json`
(default `~/.cache/trainforge/`): `time_factor` = measured / predicted step time (divides the efficiency)
and, on a GPU, `memory_factor` = measured reserved peak / simulated peak (replaces the allocator factor).
"""
from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

HOME_ENV = "TRAINFORGE_HOME"
MEASURED_STEPS = 8
WARMUP_STEPS = 3


def calibration_path() -> Path:
    home = os.environ.get(HOME_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "trainforge")
    return Path(home) / "calibration.json"


def load_calibration() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(calibration_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_calibration(device_name: str, entry: dict[str, Any]) -> Path:
    from trainforge.training.checkpoint import write_text_atomic

    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = load_calibration()
    data[device_name] = entry
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    return path


def calibrate(cfg, *, catalog=None, steps: int = MEASURED_STEPS) -> dict[str, Any]:
    """Measure `steps` real optimizer steps of `cfg` on its device; return and store predicted vs measured."""
    import torch

    from trainforge.config import apply_overrides, config_from_dict
    from trainforge.hardware.catalog import load_catalog
    from trainforge.hardware.device import resolve_device
    from trainforge.planning.plan import plan_local_step
    from trainforge.training.loop import fit
    from trainforge.training.metrics import read_metrics

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
        result = fit(short, Path(tmp) / "run")
        wall_s = time.perf_counter() - start
        rows = [r for r in read_metrics(Path(tmp) / "run" / "metrics.jsonl") if r["split"] == "train"]
    measured_step_s = statistics.median(r["step_time_s"] for r in rows[WARMUP_STEPS:])
    predicted = plan_local_step(short, device, catalog, micro_batch_size=result.micro_batch_size, calibration={})
    entry: dict[str, Any] = {
        "recipe": cfg.name,
        "date": time.strftime("%Y-%m-%d"),
        "device": predicted["gpu"],
        "micro_batch_size": result.micro_batch_size,
        "precision": predicted["precision"],
        "predicted_step_time_s": predicted["step_time_s"],
        "measured_step_time_s": measured_step_s,
        "time_factor": measured_step_s / predicted["step_time_s"],
        "predicted_peak_bytes": predicted["peak_bytes_per_gpu"],
        "simulated_peak_bytes": predicted["simulated_peak_bytes_per_gpu"],
        "measured_peak_bytes": None,
        "wall_s": wall_s,
    }
    if device.type == "cuda":
        reserved = int(torch.cuda.max_memory_reserved(device))
        entry["measured_peak_bytes"] = reserved
        entry["memory_factor"] = reserved / predicted["simulated_peak_bytes_per_gpu"]
    entry["stored_in"] = str(save_calibration(predicted["gpu"], entry))
    return entry


def describe(entry: dict[str, Any]) -> list[tuple[str, Optional[float], Optional[float]]]:
    """(quantity, predicted, measured) rows for display."""
    return [
        ("step time (s)", entry["predicted_step_time_s"], entry["measured_step_time_s"]),
        ("peak memory (GiB)", entry["predicted_peak_bytes"] / 2**30,
         None if entry["measured_peak_bytes"] is None else entry["measured_peak_bytes"] / 2**30),
    ]
