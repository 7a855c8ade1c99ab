"""One trial: sample the space, train into <out>/trials/trial-NNNN/, report each evaluation to the pruner.

    value = run_trial(optuna_trial, job)     # the objective; raises optuna.TrialPruned when pruned

The value is the metric of the run's last validation evaluation. Intermediate values are reported at
evaluation 1, 2, 3, ... (not at optimizer steps), so trials with different batch sizes or evaluation
intervals are compared after the same number of evaluations.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import optuna

from trainforge.config import apply_overrides, config_from_dict
from trainforge.tracking import tracked
from trainforge.training.api import train
from trainforge.engine.hooks import FitHooks
from trainforge.tuning.space import Param, apply_params, suggest
from trainforge.tuning.study import CRASHED, HOST, INTERRUPTED

TRIALS_DIR = "trials"


def trial_dir(out: Path, number: int) -> Path:
    return Path(out) / TRIALS_DIR / f"trial-{number:04d}"


@dataclass
class TrialJob:
    """Everything a worker needs to run trials (sent to a worker as JSON, the space as Param.to_dict())."""

    base_config: dict[str, Any]  # the resolved recipe + the user's overrides
    space: dict[str, Param]
    metric: str
    out: str
    worker_overrides: list[str] = field(default_factory=list)  # this worker's threads / progress settings


class TrialInterrupted(Exception):
    """The run stopped on SIGTERM/SIGINT: the tune run is being stopped, not the trial's fault."""


def run_trial(trial: Any, job: TrialJob, on_start: Optional[Callable[[int], None]] = None) -> float:
    """The Optuna objective. Failures are recorded in the trial's `fail_reason` before they propagate."""
    run_dir = trial_dir(Path(job.out), trial.number)
    # who runs the trial, so a later run can tell a trial whose process died from one still running
    trial.set_user_attr("host", HOST)
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("run_dir", str(run_dir))
    if on_start is not None:
        on_start(trial.number)
    evaluations = 0

    def on_eval(step: int, val: dict[str, Any]) -> bool:
        nonlocal evaluations
        evaluations += 1
        value = val.get(job.metric)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False  # a diverging run is the loop's to stop; the pruner only sees numbers
        trial.report(float(value), evaluations)
        return trial.should_prune()

    try:
        params = suggest(trial, job.space)
        raw = apply_overrides(apply_params(job.base_config, {}), job.worker_overrides)
        cfg = config_from_dict(apply_params(raw, params))
        result = train(cfg, run_dir=run_dir, hooks=tracked(FitHooks(on_eval=on_eval)))
    except KeyboardInterrupt:
        trial.set_user_attr("fail_reason", f"{INTERRUPTED} stopped by the user")
        raise
    except Exception as e:
        trial.set_user_attr("fail_reason", f"{CRASHED[0]} {describe(e)}")
        raise
    if result.status == "pruned":
        raise optuna.TrialPruned(f"pruned after evaluation {evaluations}")
    if result.status == "interrupted":
        trial.set_user_attr("fail_reason", f"{INTERRUPTED} stopped by a signal at step {result.steps}")
        raise TrialInterrupted(f"trial {trial.number} stopped by a signal")
    value = result.val.get(job.metric)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        trial.set_user_attr("fail_reason", f"{CRASHED[0]} the last evaluation's {job.metric} is {value!r}")
        raise ValueError(f"trial {trial.number}: {job.metric} is {value!r}")
    return float(value)


def describe(exc: BaseException) -> str:
    """`Type: message` in one line (the full traceback goes to the worker's stderr via Optuna)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
