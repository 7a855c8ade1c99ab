"""Train-split image augmentation whose randomness comes only from a per-sample generator.

    aug = build_augment(cfg.augment, channels=3, value_range=(0.0, 1.0))   # None when all off
    x = aug(x, generator_for("augment", seed, epoch, index))

Ops (torchvision.transforms.v2 functional), in this order: rotation, random resized crop,
horizontal flip, vertical flip, colour jitter. Every random number is drawn from the given
generator, so the same key gives bit-identical output in any process and the global RNG is untouched.
Applied to raw pixel values, before normalization.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torchvision.transforms.v2.functional as TF

from trainforge.config import AugmentConfig

CROP_RATIO = (3 / 4, 4 / 3)  # aspect ratio range of RandomResizedCrop


def _uniform(g: torch.Generator, low: float, high: float) -> float:
    return float(torch.empty(()).uniform_(low, high, generator=g))


def _randint(g: torch.Generator, high: int) -> int:
    return int(torch.randint(0, high, (), generator=g))


def crop_box(height: int, width: int, scale: tuple[float, float], g: torch.Generator) -> tuple[int, int, int, int]:
    """(top, left, h, w) as RandomResizedCrop.get_params does, but drawn from `g`."""
    area = height * width
    log_lo, log_hi = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    for _ in range(10):
        target = area * _uniform(g, *scale)
        ratio = math.exp(_uniform(g, log_lo, log_hi))
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height:
            return _randint(g, height - h + 1), _randint(g, width - w + 1), h, w
    return 0, 0, height, width  # like torchvision's fallback for extreme settings: the whole image


@dataclass(frozen=True)
class Augment:
    cfg: AugmentConfig
    channels: int
    value_range: tuple[float, float]

    def __call__(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        lo, hi = self.value_range
        height, width = x.shape[-2:]
        if cfg.rotation_deg > 0:
            angle = _uniform(g, -cfg.rotation_deg, cfg.rotation_deg)
            x = TF.rotate(x, angle, interpolation=TF.InterpolationMode.BILINEAR, fill=[lo] * self.channels)
        if cfg.crop_scale is not None:
            top, left, h, w = crop_box(height, width, cfg.crop_scale, g)
            x = TF.resized_crop(x, top, left, h, w, [height, width], antialias=True)
        if cfg.hflip > 0 and _uniform(g, 0, 1) < cfg.hflip:
            x = TF.hflip(x)
        if cfg.vflip > 0 and _uniform(g, 0, 1) < cfg.vflip:
            x = TF.vflip(x)
        if cfg.color_jitter > 0:
            x = self._jitter(x, g, lo, hi)
        return x

    def _jitter(self, x: torch.Tensor, g: torch.Generator, lo: float, hi: float) -> torch.Tensor:
        # torchvision's colour ops clamp float images to [0, 1], so work on that scale and map back.
        s = self.cfg.color_jitter
        span = max(hi - lo, 1e-12)
        x = (x - lo) / span
        x = TF.adjust_brightness(x, _uniform(g, 1 - s, 1 + s))
        if self.channels in (1, 3):  # contrast needs a grayscale mean: defined for 1 or 3 channels
            x = TF.adjust_contrast(x, _uniform(g, 1 - s, 1 + s))
        if self.channels == 3:
            x = TF.adjust_saturation(x, _uniform(g, 1 - s, 1 + s))
        return x * span + lo


def is_enabled(cfg: AugmentConfig) -> bool:
    return bool(cfg.rotation_deg or cfg.crop_scale or cfg.hflip or cfg.vflip or cfg.color_jitter)


def build_augment(cfg: AugmentConfig, *, channels: int, value_range: tuple[float, float]) -> Optional[Augment]:
    return Augment(cfg, channels, value_range) if is_enabled(cfg) else None
