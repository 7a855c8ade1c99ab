"""Experiment tracking: a run directory mirrored into MLflow (`log.mlflow`, `trainforge runs sync`)."""
from __future__ import annotations

from trainforge.tracking.mlflow_run import RunTracker, TrackingError, follow, require_mlflow, sync_run_dir

__all__ = ["RunTracker", "TrackingError", "follow", "require_mlflow", "sync_run_dir"]
