"""Input normalization fitted on the train split (z-score or min-max, per channel or per feature), or the fixed
mean and std of a pretrained model (kind "model", `data.normalize: model`; not fitted).

    norm = fit_normalizer("zscore", train_batches, view=(-1, 1, 1))   # the modality's channel_view
    norm = model_normalizer(mean, std, value_range=(0.0, 16.0))   # the model's values, on the data's pixel scale
    x = norm(x)                                          # one sample
    preprocess["normalize"] = norm.to_json()            # stored with the model
    norm = Normalizer.from_json(preprocess["normalize"], view=(-1, 1, 1))      # when serving
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch

STD_FLOOR = 1e-6


class Normalizer:
    """x -> (x - shift) / scale with per-channel (image: C,1,1) or per-feature (tabular: F) parameters: `view` is how
    they broadcast over one sample, the modality's `channel_view` (trainforge.data.modalities)."""

    def __init__(self, kind: str, shift: torch.Tensor, scale: torch.Tensor, stats: dict[str, Any]) -> None:
        self.kind, self.shift, self.scale, self.stats = kind, shift, scale, stats

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        return (x - self.shift) / self.scale

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.stats}

    @classmethod
    def from_json(cls, data: dict[str, Any], view: Sequence[int]) -> "Normalizer":
        kind = data["kind"]
        if kind == "none":
            return identity()
        constant = data.get("constant_features", [])  # absent in models saved before constant features had scale 1
        if kind == "zscore":
            return _make(kind, torch.tensor(data["mean"]), torch.tensor(data["std"]), view, constant)
        if kind == "minmax":
            lo, hi = torch.tensor(data["min"]), torch.tensor(data["max"])
            return _make(kind, lo, hi, view, constant)
        if kind == "model":
            return _fixed(data["mean"], data["std"])
        raise ValueError(f"unknown normalization kind {kind!r}")


def identity() -> Normalizer:
    return Normalizer("none", torch.zeros(()), torch.ones(()), {})


def model_normalizer(mean: Sequence[float], std: Sequence[float], value_range: tuple[float, float]) -> Normalizer:
    """A pretrained model's per-channel mean and std, which are of pixels in [0, 1], on the data's pixel scale
    [lo, hi] (digits' ink counts 0..16): (x - (lo + mean * (hi - lo))) / (std * (hi - lo)). Stored on that scale."""
    lo, hi = (float(v) for v in value_range)
    return _fixed([lo + m * (hi - lo) for m in mean], [s * (hi - lo) for s in std])


def _fixed(mean: Sequence[float], std: Sequence[float]) -> Normalizer:
    """Kind "model": derived in float64 and rounded to float32 like `_make` (serving does the same in numpy)."""
    a, b = torch.tensor(mean, dtype=torch.float64), torch.tensor(std, dtype=torch.float64)
    stats = {"mean": a.tolist(), "std": b.tolist()}
    return Normalizer("model", a.float().reshape(-1, 1, 1), b.float().reshape(-1, 1, 1), stats)


def _make(kind: str, a: torch.Tensor, b: torch.Tensor, view: Sequence[int], constant: Sequence[int]) -> Normalizer:
    """zscore: a = mean, b = std; minmax: a = min, b = max.

    A feature (channel) in `constant` had one value in all of the train split: dividing by a floored
    spread would turn any other value seen later into ~1e6, so it gets scale 1 and is only centred.
    The zscore `std` stored is the divisor used (floored; 1 for constant features).
    """
    a, b = a.double(), b.double()
    is_constant = torch.zeros(a.shape, dtype=torch.bool)
    is_constant[list(constant)] = True
    spread = b if kind == "zscore" else b - a
    scale = torch.where(is_constant, torch.ones_like(spread), spread.clamp_min(STD_FLOOR))
    if kind == "zscore":
        stats: dict[str, Any] = {"mean": a.tolist(), "std": scale.tolist()}
    else:
        stats = {"min": a.tolist(), "max": b.tolist()}
    stats["constant_features"] = [int(i) for i in constant]
    return Normalizer(kind, a.float().reshape(tuple(view)), scale.float().reshape(tuple(view)), stats)


def fit_normalizer(kind: str, batches: Iterable[torch.Tensor], view: Sequence[int]) -> Normalizer:
    """Fit on raw train batches (B, C, H, W) or (B, F), streaming, in float64.

    Channels are axis 1 of a batch for both image and tabular data, so one reduction serves both.
    A channel is constant when its train minimum equals its maximum, exactly: a variance from sums
    of squares is not exactly 0 for a constant value.
    """
    if kind == "none":
        return identity()
    count, total, total_sq, lo, hi = 0, None, None, None, None
    for batch in batches:
        dims = [d for d in range(batch.ndim) if d != 1]
        if kind == "zscore":
            x = batch.double()
            s, sq = x.sum(dim=dims), (x * x).sum(dim=dims)
            total, total_sq = (s, sq) if total is None else (total + s, total_sq + sq)
        mn, mx = batch.amin(dim=dims).double(), batch.amax(dim=dims).double()
        lo, hi = (mn, mx) if lo is None else (torch.minimum(lo, mn), torch.maximum(hi, mx))
        count += batch.numel() // batch.shape[1]
    assert count > 0, "fit_normalizer needs at least one sample"
    constant = torch.nonzero(lo == hi).flatten().tolist()
    if kind == "zscore":
        mean = total / count
        std = (total_sq / count - mean * mean).clamp_min(0).sqrt()
        mean[lo == hi] = lo[lo == hi]  # exactly the value: a constant feature is centred to exactly 0
        return _make(kind, mean, std, view, constant)
    return _make(kind, lo, hi, view, constant)
