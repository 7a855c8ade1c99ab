"""Input normalization fitted on the train split: z-score or min-max, per channel or per feature.

    norm = fit_normalizer("zscore", train_batches, modality="image")
    x = norm(x)                                          # one sample
    preprocess["normalize"] = norm.to_json()            # stored with the model
    norm = Normalizer.from_json(preprocess["normalize"], modality="image")   # when serving
"""
from __future__ import annotations

from typing import Any, Iterable

import torch

STD_FLOOR = 1e-6


class Normalizer:
    """x -> (x - shift) / scale with per-channel (image: C,1,1) or per-feature (tabular: F) parameters."""

    def __init__(self, kind: str, shift: torch.Tensor, scale: torch.Tensor, stats: dict[str, list[float]]) -> None:
        self.kind, self.shift, self.scale, self.stats = kind, shift, scale, stats

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return x
        return (x - self.shift) / self.scale

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.stats}

    @classmethod
    def from_json(cls, data: dict[str, Any], modality: str) -> "Normalizer":
        kind = data["kind"]
        if kind == "none":
            return identity()
        if kind == "zscore":
            return _make(kind, torch.tensor(data["mean"]), torch.tensor(data["std"]), modality)
        if kind == "minmax":
            lo, hi = torch.tensor(data["min"]), torch.tensor(data["max"])
            return _make(kind, lo, hi, modality)
        raise ValueError(f"unknown normalization kind {kind!r}")


def identity() -> Normalizer:
    return Normalizer("none", torch.zeros(()), torch.ones(()), {})


def _make(kind: str, a: torch.Tensor, b: torch.Tensor, modality: str) -> Normalizer:
    """zscore: a = mean, b = std; minmax: a = min, b = max."""
    a, b = a.double(), b.double()
    if kind == "zscore":
        shift, scale = a, b.clamp_min(STD_FLOOR)
        stats = {"mean": a.tolist(), "std": scale.tolist()}
    else:
        shift, scale = a, (b - a).clamp_min(STD_FLOOR)
        stats = {"min": a.tolist(), "max": b.tolist()}
    view = (-1, 1, 1) if modality == "image" else (-1,)
    return Normalizer(kind, shift.float().reshape(view), scale.float().reshape(view), stats)


def fit_normalizer(kind: str, batches: Iterable[torch.Tensor], modality: str) -> Normalizer:
    """Fit on raw train batches (B, C, H, W) or (B, F), streaming, in float64.

    Channels are axis 1 of a batch for both image and tabular data, so one reduction serves both.
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
        else:
            mn, mx = batch.amin(dim=dims).double(), batch.amax(dim=dims).double()
            lo, hi = (mn, mx) if lo is None else (torch.minimum(lo, mn), torch.maximum(hi, mx))
        count += batch.numel() // batch.shape[1]
    assert count > 0, "fit_normalizer needs at least one sample"
    if kind == "zscore":
        mean = total / count
        std = (total_sq / count - mean * mean).clamp_min(0).sqrt()
        return _make(kind, mean, std, modality)
    return _make(kind, lo, hi, modality)
