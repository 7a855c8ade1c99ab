"""Experiment tracking: a run directory mirrored into MLflow (`log.mlflow`, `trainforge runs sync`)."""
from __future__ import annotations

from trainforge.tracking.mlflow_run import (MlflowObserver, RunTracker, TrackingError, follow, require_mlflow,
                                             sync_run_dir, tracked)

__all__ = ["MlflowObserver", "RunTracker", "TrackingError", "follow", "require_mlflow", "sync_run_dir", "tracked"]
