"""Early stopping on a validation metric with patience; its state (the best value, its step and metrics, the
evaluations since) is saved in checkpoints."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EarlyStopper:
    metric: str
    mode: str  # "min" | "max"
    patience: int
    min_delta: float = 0.0
    best: float = math.nan
    bad_evals: int = 0
    best_step: int = 0  # the step whose weights are kept, and its validation metrics
    best_metrics: dict[str, Any] = field(default_factory=dict)

    def update(self, metrics: dict, step: int = 0) -> bool:
        """Record the evaluation after `step`; True when this one is the best so far."""
        if self.metric not in metrics:
            raise ValueError(
                f"train.early_stopping.metric: {self.metric!r} is not reported; choose one of {sorted(metrics)}"
            )
        value = float(metrics[self.metric])
        sign = 1.0 if self.mode == "max" else -1.0
        improved = math.isnan(self.best) or sign * (value - self.best) > self.min_delta
        if improved:
            self.best, self.bad_evals = value, 0
            self.best_step, self.best_metrics = step, dict(metrics)
        else:
            self.bad_evals += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.bad_evals >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "bad_evals": self.bad_evals, "best_step": self.best_step,
                "best_metrics": dict(self.best_metrics)}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.bad_evals = float(state["best"]), int(state["bad_evals"])
        # checkpoints written before the best step was kept lack the last two
        self.best_step, self.best_metrics = int(state.get("best_step", 0)), dict(state.get("best_metrics", {}))
