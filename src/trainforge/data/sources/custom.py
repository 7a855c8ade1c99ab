"""`custom`: the user's own data, `data.target = "pkg.module:attr"`.

The module is imported only here, when the user's config names it. `attr(**data.args)` — a function, or a
`torch.utils.data.Dataset` class; a parameter named `seed` gets the run's seed — returns one of:
- `(X, y)`: X float (N, C, H, W) for images or (N, F) for tabular, y integer class ids 0..K-1;
- a map-style dataset (`len(ds)`, `ds[i] -> (x, y)`), read once into memory: the same shapes per sample;
- a Pool (data/samples.py) of samples of any registered modality (`DataInfo.modality`; a plug-in module's own);
- a finished DataBundle (then nothing else is done to it).
All but the last go through the normal cleaning / split / normalize / augment path.
"""
from __future__ import annotations

from typing import Any, Union

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.base import DataBundle, DataInfo
from trainforge.data.pool import Pool, TensorSamples
from trainforge.data.sources.common import SOURCES
from trainforge.errors import UserError
from trainforge.imports import call_user, load_target


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
        modality, preprocess = "image", {"image_size": x.shape[-1], "channels": x.shape[1]}
    elif x.ndim == 2:
        modality, preprocess = "tabular", {"num_features": x.shape[1]}
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
    samples = TensorSamples(x, labels)
    return Pool(info, samples, labels=labels.numpy(), rows_read=len(x), preprocess=preprocess, value_range=value_range)


def pool_from_dataset(dataset: Any, target: str) -> Pool:
    """A map-style dataset (`len(ds)`, `ds[i] -> (x, y)`), read once into memory."""
    xs, ys = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise UserError(f"data.target: {target}[{i}] is {type(item).__name__}; each sample must be an (x, y) pair")
        x = _as_tensor(item[0], f"x of sample {i}")
        if xs and x.shape != xs[0].shape:
            raise UserError(f"data.target: {target}[{i}] has x of shape {tuple(x.shape)}, sample 0 of "
                            f"{tuple(xs[0].shape)}; every sample must have the same shape")
        xs.append(x)
        ys.append(_as_tensor(item[1], f"y of sample {i}").reshape(-1)[:1])
    if not xs:
        raise UserError(f"data.target: {target} is empty; return at least one sample")
    return pool_from_arrays(torch.stack(xs), torch.cat(ys))


def is_map_dataset(value: Any) -> bool:
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (tuple, list, dict, str))


@SOURCES.register("custom")
def custom(cfg: DataConfig, *, seed: int) -> Union[Pool, DataBundle]:
    """data.target "pkg.module:factory" (or a Dataset class); data.args are its keyword arguments, and a
    parameter named `seed` gets the run's seed."""
    factory = load_target(cfg.target, "data.target")
    result = call_user(factory, target=cfg.target, key="data.target", args_key="data.args", args=dict(cfg.args),
                       filled={"seed": seed})
    if isinstance(result, (DataBundle, Pool)):
        return result
    if isinstance(result, (tuple, list)) and len(result) == 2:
        return pool_from_arrays(*result)
    if is_map_dataset(result):
        return pool_from_dataset(result, cfg.target)
    raise UserError(f"data.target: {cfg.target} returned {type(result).__name__}; return (X, y) arrays, a "
                    "map-style Dataset of (x, y) samples, a Pool or a DataBundle")
