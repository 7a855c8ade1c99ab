"""Early stopping on a validation metric with patience; its state is two numbers, saved in checkpoints."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EarlyStopper:
    metric: str
    mode: str  # "min" | "max"
    patience: int
    min_delta: float = 0.0
    best: float = math.nan
    bad_evals: int = 0

    def update(self, metrics: dict) -> bool:
        """Record one evaluation; True when this one is the best so far."""
        if self.metric not in metrics:
            raise ValueError(
                f"train.early_stopping.metric: {self.metric!r} is not reported; choose one of {sorted(metrics)}"
            )
        value = float(metrics[self.metric])
        sign = 1.0 if self.mode == "max" else -1.0
        improved = math.isnan(self.best) or sign * (value - self.best) > self.min_delta
        if improved:
            self.best, self.bad_evals = value, 0
        else:
            self.bad_evals += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.bad_evals >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "bad_evals": self.bad_evals}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.bad_evals = float(state["best"]), int(state["bad_evals"])
