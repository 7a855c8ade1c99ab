"""trainforge: plan, train, evaluate and compress PyTorch models from YAML recipes.

The Python API:

    import trainforge
    cfg = trainforge.load_config("recipes/digits_cnn.yaml", ["train.epochs=3"])
    result = trainforge.train(cfg, run_dir="runs/try")      # -> TrainResult(run_dir, status, steps, eval, ...)
    metrics = trainforge.evaluate("runs/try", split="test")  # -> dict (accuracy, macro_f1, ...)
    report = trainforge.plan(cfg, gpus=["h100-sxm"], num_gpus=[1, 8])   # -> dict, as `plan --json`
    study = trainforge.tune("digits_cnn", "recipes/sweeps/digits_cnn.yaml", trials=20)  # -> dict, as `tune --json`
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainforge.config import Config, load_config
from trainforge.errors import JobFailed, UserError

__version__ = "0.1.0"
__all__ = ["Config", "JobFailed", "UserError", "load_config", "train", "evaluate", "plan", "tune", "compress", "__version__"]

if TYPE_CHECKING:
    from trainforge.training.loop import TrainResult


class _EnumConstantNotes(logging.Filter):
    """Drops torch's note that registering an Enum as a pytree constant is deprecated: torchao registers its
    enums when it is imported (by transformers too, for every hf model), one warning line each, none of them
    about the user's run or fixable by its user."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is an Enum subclass and is now natively supported" not in record.getMessage()


logging.getLogger("torch.utils._pytree").addFilter(_EnumConstantNotes())


def train(config: Any = None, **kwargs: Any) -> "TrainResult":
    """See `trainforge.training.api.train`; log.mlflow's tracking is composed here (training imports none of it).
    Imported lazily so `import trainforge` stays cheap."""
    from trainforge.tracking import tracked  # light until used: MLflow loads only when a run asks for it
    from trainforge.training.api import train as _train  # heavy (torch): `import trainforge` stays light

    return _train(config, **{**kwargs, "hooks": tracked(kwargs.get("hooks"))})


def evaluate(checkpoint: Any, split: str = "test", device: Any = None) -> dict:
    """Metrics of a run dir, final/ or checkpoints/step-* on a split. See `trainforge.training.evaluate`."""
    from trainforge.training.evaluate import evaluate_checkpoint  # heavy (torch): `import trainforge` stays light

    return evaluate_checkpoint(checkpoint, split=split, device=device)


def plan(config: Any = None, **kwargs: Any) -> dict:
    """Memory, time and cost on candidate GPUs: the `plan --json` document (`Plan.to_json()`); for the typed
    `Plan` call `trainforge.planning.plan.plan` (config: Config or recipe)."""
    from trainforge.planning.plan import plan as _plan  # heavy (torch): `import trainforge` stays light

    cfg = config if isinstance(config, Config) else load_config(config)
    return _plan(cfg, **kwargs).to_json()


def tune(recipe: Any, space: Any, **kwargs: Any) -> dict:
    """Hyperparameter search over a space file; see `trainforge.tuning.api.tune` (trials=N is required)."""
    from trainforge.tuning.api import tune as _tune  # heavy (optuna, torch on use): `import trainforge` stays light

    return _tune(recipe, space, **kwargs)


def compress(checkpoint: Any, out: Any = None, **options: Any) -> dict:
    """Prune, fine-tune, quantize and export a checkpoint; options are `CompressOptions` fields
    (prune, finetune_epochs, distill, quantize, int8_method, threads, ...). See `trainforge.compression`."""
    from trainforge.compression.pipeline import CompressOptions, compress as _compress  # heavy (torch, onnx): `import trainforge` stays light
    from trainforge.tracking import MlflowObserver  # light until used, as in train

    return _compress(checkpoint, out, CompressOptions(**options), observer=MlflowObserver())
