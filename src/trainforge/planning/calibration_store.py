"""The calibration factors file: where it is, reading it, writing one device's entry, describing an entry.

Stored per device (the catalog name of the local GPU, or "cpu") in `$TRAINFORGE_HOME/calibration.json`
(default `~/.cache/trainforge/`): `time_factor` = measured / predicted step time (divides the efficiency)
and, on a GPU, `memory_factor` = measured reserved peak / simulated peak (replaces the allocator factor).

Only storage: the planner (`plan`, `auto`) reads the factors from here, and `training.calibrate`, which
runs real steps through the training loop, writes them here; nothing below `calibrate` imports it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from trainforge.files import HOME_ENV, trainforge_home, write_text_atomic

__all__ = ["HOME_ENV", "calibration_path", "describe", "load_calibration", "save_calibration"]


def calibration_path() -> Path:
    return trainforge_home() / "calibration.json"


def load_calibration() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(calibration_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_calibration(device_name: str, entry: dict[str, Any]) -> Path:
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = load_calibration()
    data[device_name] = entry
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    return path


def describe(entry: dict[str, Any]) -> list[tuple[str, Optional[float], Optional[float]]]:
    """(quantity, predicted, measured) rows for display."""
    return [
        ("step time (s)", entry["predicted_step_time_s"], entry["measured_step_time_s"]),
        ("peak memory (GiB)", entry["predicted_peak_bytes"] / 2**30,
         None if entry["measured_peak_bytes"] is None else entry["measured_peak_bytes"] / 2**30),
    ]
