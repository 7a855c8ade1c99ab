"""How another stage steers or watches one run without a second loop: `FitHooks`, and the `RunObserver` interface that
tracking implements. They live here, below `training/`, so that tracking (and anything else that observes runs)
implements the interface without importing the training loop, and the loop calls it without knowing who it is.

    hooks = FitHooks(on_eval=lambda step, metrics: metrics["loss"] > 10)     # a tuner's pruner
    trainforge.train(cfg, hooks=tracking.tracked(hooks))                       # + the MLflow observer (log.mlflow)

Standard library only at import: the types that name torch are annotations.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from trainforge.config import Config
    from trainforge.data.base import DataInfo

LossFn = Callable[[Any, Any], "torch.Tensor"]  # (the model's output, the task's batch) -> the scalar to backpropagate


class RunObserver(Protocol):
    """Something outside training that watches a run from its directory (tracking's MLflow mirror): composed by
    the caller at the edge (the Python API, the command line), so neither training nor compression imports it."""

    def check(self, cfg: Config) -> None:
        """Before any work: UserError if this run cannot be observed as its config asks (a missing extra)."""

    def follow(self, run_dir: Path, cfg: Config) -> ContextManager[Any]:
        """Around the fit, on rank 0: yields None, or an object whose finish(status) ends the observation."""

    def publish(self, run_dir: Path, cfg: Config) -> Optional[dict[str, Any]]:
        """After a stage added files to a finished run (compress's ONNX variants): send them where the run is
        observed; None when the config observes nothing. A UserError says what failed, in one line."""


@dataclass
class FitHooks:
    """How another stage (tune, compress, tracking) steers or watches one run without a second loop.

    build_model(info) -> nn.Module replaces the registry model (e.g. a pruned network; it must build the
        same architecture on resume). loss(output, batch) -> scalar replaces the task loss (e.g. distillation): the model's output and the task's
        batch as its collate made it, whatever the task's inputs are.
    on_eval(step, val_metrics) -> True ends the run after that evaluation with status "pruned" (a tuner's
        pruner); no final model is written then.
    observer: watches the run from rank 0 (`tracking.tracked(hooks)` adds the MLflow mirror of log.mlflow).
    """

    build_model: Optional[Callable[[DataInfo], nn.Module]] = None
    loss: Optional[LossFn] = None
    on_eval: Optional[Callable[[int, dict[str, Any]], bool]] = None
    observer: Optional[RunObserver] = None
