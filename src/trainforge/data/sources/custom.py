"""`custom`: the user's own data factory, `data.target = "pkg.module:factory"`.

The module is imported only here, when the user's config names it. `factory(**data.args)`
returns either `(X, y)` — X float (N, C, H, W) for images or (N, F) for tabular, y integer class
ids — which then goes through the normal cleaning/split/normalize path, or a finished DataBundle.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Union

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.base import DataBundle, DataInfo
from trainforge.data.pool import Pool, TensorSamples
from trainforge.data.sources.common import SOURCES
from trainforge.errors import UserError
from trainforge.imports import load_target


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    try:
        return torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor) else value.detach().cpu())
    except (TypeError, ValueError) as e:
        raise UserError(f"data.target: factory returned {what} that is not an array ({e})") from None


def pool_from_arrays(X: Any, y: Any) -> Pool:
    """(X, y) arrays -> a Pool; shapes and label values are checked here."""
    x = _as_tensor(X, "X").float()
    labels = _as_tensor(y, "y")
    if x.ndim == 4:
        modality = "image"
    elif x.ndim == 2:
        modality = "tabular"
    else:
        raise UserError(f"data.target: factory returned X of shape {tuple(x.shape)}; expected (N, C, H, W) or (N, F)")
    if labels.shape != (len(x),):
        raise UserError(f"data.target: factory returned y of shape {tuple(labels.shape)}; expected ({len(x)},)")
    if labels.is_floating_point() and not torch.equal(labels, labels.round()):
        raise UserError("data.target: factory returned non-integer labels y; return class ids 0..K-1")
    labels = labels.long()
    if len(labels) == 0 or int(labels.min()) < 0:
        raise UserError("data.target: factory returned no samples or negative labels; return class ids 0..K-1")
    num_classes = int(labels.max()) + 1
    names = tuple(str(c) for c in range(num_classes))
    info = DataInfo("classification", modality, tuple(x.shape[1:]), "float32", num_classes, names)
    finite = x[torch.isfinite(x)]
    value_range = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 1.0)
    if modality == "image":
        preprocess = {"image_size": x.shape[-1], "channels": x.shape[1]}
    else:
        preprocess = {"num_features": x.shape[1]}
    samples = TensorSamples(x, labels)
    return Pool(info, samples, labels=labels.numpy(), rows_read=len(x), preprocess=preprocess, value_range=value_range)


def check_args(factory: Callable[..., Any], cfg: DataConfig) -> None:
    """data.args must fit the factory's signature: unknown keys are named, missing ones reported."""
    try:
        sig = inspect.signature(factory)
    except ValueError:  # no signature available (some builtins): let the call itself decide
        return
    params = sig.parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        valid = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.POSITIONAL_ONLY)]
        for key in cfg.args:
            if key not in valid:
                raise UserError(
                    f"data.args.{key}: unknown argument for {cfg.target}; valid: {', '.join(valid) or '(none)'}"
                )
    try:
        sig.bind(**cfg.args)
    except TypeError as e:
        raise UserError(f"data.args: {cfg.target} cannot be called with these arguments ({e})") from None


@SOURCES.register("custom")
def custom(cfg: DataConfig, *, seed: int) -> Union[Pool, DataBundle]:
    """data.target "pkg.module:factory"; data.args are passed to it as keyword arguments."""
    factory = load_target(cfg.target, "data.target")
    check_args(factory, cfg)
    result = factory(**cfg.args)
    if isinstance(result, DataBundle):
        return result
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise UserError(f"data.target: {cfg.target} returned {type(result).__name__}; return (X, y) or a DataBundle")
    return pool_from_arrays(*result)
