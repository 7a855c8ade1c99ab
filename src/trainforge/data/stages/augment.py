"""Train-split augmentation whose randomness comes only from a per-sample generator.

    aug = build_augment(cfg.augment, channels=3, value_range=(0.0, 1.0))   # images; None when all off
    aug = build_text_augment(cfg.augment)                                  # text classification
    x = aug(x, generator_for("augment", seed, epoch, index))

Image ops (torchvision.transforms.v2 functional), in this order: rotation, random resized crop,
horizontal flip, vertical flip, colour jitter; applied to raw pixel values, before normalization.
Text ops on token ids, in this order: window crop, token dropout, token masking (see TextAugment).
Every random number is drawn from the given generator, so the same key gives bit-identical output
in any process and the global RNG is untouched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from trainforge.config import AugmentConfig
from trainforge.data.text.byte_level import PAD_ID

CROP_RATIO = (3 / 4, 4 / 3)  # aspect ratio range of RandomResizedCrop
MIN_WINDOW_TOKENS = 8  # a text window crop keeps at least this many tokens (all of a shorter text)
IMAGE_OPS = ("rotation_deg", "crop_scale", "hflip", "vflip", "color_jitter")
TEXT_OPS = ("token_crop", "token_dropout", "token_mask")
VOLUME_OPS = ("hflip", "vflip", "dflip", "intensity_shift")  # on (C, D, H, W): flips along W, H, D; an offset
POINT_OPS = ("gt_sampling", "world_rotation_deg", "world_scaling", "world_flip")  # a point cloud and its boxes
ALL_OPS = tuple(dict.fromkeys(IMAGE_OPS + TEXT_OPS + VOLUME_OPS + POINT_OPS))  # every data.augment setting, once


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

    def __post_init__(self) -> None:
        # heavy (about 1.9 s, torch._dynamo included): imported here, in the process that builds the data, before
        # any loader worker forks, and never by a run without image augmentation
        import torchvision.transforms.v2.functional  # noqa: F401

    def __call__(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return self.geometric([x], g)[0]

    def geometric(self, items: list, g: torch.Generator, fill: float = 0) -> list:
        """The ops on the image `items[0]` and, moved with its pixels, the tv_tensors after it (BoundingBoxes,
        Mask): each op's parameters are drawn once, from `g`; colour jitter changes the image only. What a rotation
        brings into view is the image's lowest value in the image and `fill` in a mask."""
        import torchvision.transforms.v2.functional as TF  # loaded by __post_init__: a lookup here

        cfg = self.cfg
        lo, hi = self.value_range
        height, width = items[0].shape[-2:]

        def each(op, **kwargs):
            return [op(v, **kwargs) for v in items]

        if cfg.rotation_deg > 0:
            angle = _uniform(g, -cfg.rotation_deg, cfg.rotation_deg)
            items = [TF.rotate(v, angle, interpolation=TF.InterpolationMode.BILINEAR if i == 0 else
                               TF.InterpolationMode.NEAREST, fill=[lo] * self.channels if i == 0 else fill)
                     for i, v in enumerate(items)]
        if cfg.crop_scale is not None:
            top, left, h, w = crop_box(height, width, cfg.crop_scale, g)
            items = [TF.resized_crop(v, top, left, h, w, [height, width], antialias=True) if i == 0 else
                     TF.resized_crop(v, top, left, h, w, [height, width],
                                     interpolation=TF.InterpolationMode.NEAREST) for i, v in enumerate(items)]
        if cfg.hflip > 0 and _uniform(g, 0, 1) < cfg.hflip:
            items = each(TF.hflip)
        if cfg.vflip > 0 and _uniform(g, 0, 1) < cfg.vflip:
            items = each(TF.vflip)
        if cfg.color_jitter > 0:
            items = [self._jitter(items[0], g, lo, hi), *items[1:]]
        return items

    def _jitter(self, x: torch.Tensor, g: torch.Generator, lo: float, hi: float) -> torch.Tensor:
        import torchvision.transforms.v2.functional as TF  # loaded by __post_init__: a lookup here

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


MIN_BOX_SIDE = 1.0  # pixels: a box an augmentation squeezes below this (cut off by a crop, out of view) is dropped


@dataclass(frozen=True)
class BoxAugment:
    """The image ops on (image, {"boxes": xyxy pixels, "labels", ...}) samples (detection): the boxes move with the
    pixels (torchvision.transforms.v2 on tv_tensors.BoundingBoxes), are clipped to the image, and a box left
    narrower than MIN_BOX_SIDE is dropped with its label (what torchvision's SanitizeBoundingBoxes does). The
    dataset calls it with the target: `takes_target`."""

    image: Augment
    takes_target = True

    def __call__(self, x: torch.Tensor, target: dict, g: torch.Generator) -> tuple[torch.Tensor, dict]:
        from torchvision import tv_tensors
        import torchvision.transforms.v2.functional as TF

        boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=tuple(x.shape[-2:]))
        x, boxes = self.image.geometric([x, boxes], g)
        boxes = TF.clamp_bounding_boxes(boxes).as_subclass(torch.Tensor)
        keep = ((boxes[:, 2] - boxes[:, 0]) >= MIN_BOX_SIDE) & ((boxes[:, 3] - boxes[:, 1]) >= MIN_BOX_SIDE)
        moved = {k: (v[keep] if isinstance(v, torch.Tensor) and len(v) == len(keep) else v)
                 for k, v in target.items()}
        moved["boxes"] = boxes[keep]
        return x, moved


@dataclass(frozen=True)
class MaskAugment:
    """The image ops on (image, mask (H, W) of class indices) samples (segmentation): the mask moves with the pixels
    (torchvision.transforms.v2 on tv_tensors.Mask, nearest-neighbour), and what a rotation brings into view is
    `ignore` (no class). The dataset calls it with the target: `takes_target`."""

    image: Augment
    ignore: int
    takes_target = True

    def __call__(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        from torchvision import tv_tensors

        x, moved = self.image.geometric([x, tv_tensors.Mask(mask[None])], g, fill=self.ignore)
        return x, moved.as_subclass(torch.Tensor)[0]


@dataclass(frozen=True)
class TextAugment:
    """Token-level augmentation of one right-padded (T,) int64 sequence; the output has the same shape.

    The text is the tokens up to the last non-pad one (the pad id inside it stays a token). `pad_id` is the
    data's padding id (DataInfo.pad_id: PAD_ID for the byte tokenizer, the model tokenizer's own otherwise).
    In order:
    - token_crop f: keep a random contiguous window of L tokens, L uniform in
      [max(ceil(f * n), min(n, MIN_WINDOW_TOKENS)), n], moved to the start;
    - token_dropout p: delete each token with probability p (never all of them);
    - token_mask p: replace each token by the pad id with probability p (never all of them); the text
      models ignore pad positions, so a masked token is hidden without shifting the others.
    The result is right-padded with the pad id back to T.
    """

    cfg: AugmentConfig
    pad_id: int = PAD_ID

    def __call__(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        real = torch.nonzero(x != self.pad_id)
        n = int(real[-1]) + 1 if len(real) else 0
        if n == 0:
            return x
        tokens = x[:n]
        if cfg.token_crop is not None:
            low = max(math.ceil(cfg.token_crop * n), min(n, MIN_WINDOW_TOKENS))
            length = low + _randint(g, n - low + 1)
            start = _randint(g, n - length + 1)
            tokens = tokens[start : start + length]
        if cfg.token_dropout > 0:
            keep = torch.rand(len(tokens), generator=g) >= cfg.token_dropout
            if keep.any():
                tokens = tokens[keep]
        if cfg.token_mask > 0:
            masked = torch.rand(len(tokens), generator=g) < cfg.token_mask
            if not masked.all():
                tokens = tokens.masked_fill(masked, self.pad_id)
        out = torch.full_like(x, self.pad_id)
        out[: len(tokens)] = tokens
        return out


def image_ops_set(cfg: AugmentConfig) -> list[str]:
    """The image augmentation settings that are switched on, by name."""
    return [name for name in IMAGE_OPS if getattr(cfg, name)]


def volume_ops_set(cfg: AugmentConfig) -> list[str]:
    """The volume augmentation settings that are switched on, by name."""
    return [name for name in VOLUME_OPS if getattr(cfg, name)]


@dataclass(frozen=True)
class VolumeAugment:
    """A volume's train-split augmentation (C, D, H, W): a flip along each axis with its probability (dflip: D,
    vflip: H, hflip: W), then one intensity offset from [-intensity_shift, intensity_shift]; drawn from `g` in that
    order, so the same key gives the same volume in any process."""

    cfg: AugmentConfig

    def __call__(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return self.both(x, None, g)[0]

    def both(self, x: torch.Tensor, mask: Optional[torch.Tensor],
             g: torch.Generator) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The volume and, flipped with it, its mask of class indices (D, H, W); the intensity offset is the
        volume's only."""
        for p, axis in ((self.cfg.dflip, -3), (self.cfg.vflip, -2), (self.cfg.hflip, -1)):
            if p > 0 and _uniform(g, 0.0, 1.0) < p:
                x = torch.flip(x, (axis,))
                mask = None if mask is None else torch.flip(mask, (axis,))
        if self.cfg.intensity_shift > 0:
            x = x + _uniform(g, -self.cfg.intensity_shift, self.cfg.intensity_shift)
        return x, mask


@dataclass(frozen=True)
class VolumeMaskAugment:
    """A volume's train-split augmentation on (volume, mask) samples (3D segmentation): first, with a `patch`, a
    crop of that size (its centre a foreground voxel half the time, where there is one, else anywhere: MONAI's
    positive/negative sampling), then `volume`'s flips (the mask with it) and intensity offset. The dataset calls it
    with the target: `takes_target`."""

    volume: Optional[VolumeAugment]
    patch: Optional[tuple[int, int, int]] = None
    takes_target = True

    def __call__(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        if self.patch is not None:
            x, mask = self.crop(x, mask, g)
        if self.volume is None:
            return x, mask
        x, moved = self.volume.both(x, mask, g)
        assert moved is not None
        return x, moved

    def crop(self, x: torch.Tensor, mask: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.patch is not None
        sizes = mask.shape
        foreground = torch.nonzero((mask > 0) & (mask != 255))
        if len(foreground) and _uniform(g, 0.0, 1.0) < 0.5:
            centre = foreground[_randint(g, len(foreground))].tolist()
        else:
            centre = [_randint(g, s) for s in sizes]
        starts = [min(max(c - p // 2, 0), s - p) for c, p, s in zip(centre, self.patch, sizes)]
        window = tuple(slice(s, s + p) for s, p in zip(starts, self.patch))
        return x[(slice(None), *window)], mask[window]


def build_volume_augment(cfg: AugmentConfig) -> Optional[VolumeAugment]:
    return VolumeAugment(cfg) if volume_ops_set(cfg) else None


def text_ops_set(cfg: AugmentConfig) -> list[str]:
    """The text augmentation settings that are switched on, by name."""
    return [name for name in TEXT_OPS if getattr(cfg, name)]


def is_enabled(cfg: AugmentConfig) -> bool:
    return bool(image_ops_set(cfg) or text_ops_set(cfg) or volume_ops_set(cfg))


def build_augment(cfg: AugmentConfig, *, channels: int, value_range: tuple[float, float]) -> Optional[Augment]:
    return Augment(cfg, channels, value_range) if image_ops_set(cfg) else None


def build_text_augment(cfg: AugmentConfig, pad_id: Optional[int] = None) -> Optional[TextAugment]:
    return TextAugment(cfg, PAD_ID if pad_id is None else pad_id) if text_ops_set(cfg) else None


@dataclass(frozen=True)
class PointAugment:
    """Objects of other frames pasted in first where `gt_sampling` asks for them (trainforge.points3d.paste_objects:
    `objects` is the train split's database, which the point-cloud samples bind: `target_augment`); then the whole
    frame moved (trainforge.points3d.global_transform): mirrored across the x axis with probability `flip`, turned
    about z by an angle from [-rotation_deg, rotation_deg], scaled by a factor from `scaling`; the boxes with their
    points. Drawn from the sample's generator, so a resumed run sees the same scenes. The transform is recorded in the
    target ("transform", and "pasted": how many of the last boxes, and of the last points, were pasted), so a point
    can be taken back to where the sensor saw it. The dataset calls it with the target: `takes_target`."""

    rotation_deg: float = 0.0
    scaling: Optional[tuple[float, float]] = None
    flip: float = 0.0
    gt_sampling: tuple[tuple[str, int], ...] = ()  # (class name, objects a frame should hold)
    gt_min_points: int = 5
    objects: Any = None  # the database's source: .get() -> ObjectDatabase, .wanted -> {label: count}
    takes_target = True

    def __call__(self, x: torch.Tensor, target: dict, g: torch.Generator) -> tuple[torch.Tensor, dict]:
        from trainforge.points3d import global_transform, paste_objects

        points, boxes = x.numpy(), target["boxes"].numpy()
        extra: dict[str, Any] = {}
        if self.gt_sampling and self.objects is not None:
            database = self.objects.get()
            labels = target["labels"].numpy()
            points, boxes, labels, taken = paste_objects(
                points, boxes, labels, database, self.objects.wanted,
                lambda n, k: torch.randperm(n, generator=g)[:k].numpy())
            pasted_points = sum(len(database.points[i]) for i in taken)
            extra = {"labels": torch.from_numpy(labels), "pasted": {"boxes": len(taken), "points": pasted_points}}
            if "difficulty" in target:
                extra["difficulty"] = torch.cat([target["difficulty"], torch.from_numpy(database.difficulty[taken])])
        draws = torch.rand(3, generator=g, dtype=torch.float64).tolist()
        flip = draws[0] < self.flip
        rotation = math.radians((2 * draws[1] - 1) * self.rotation_deg)
        scale = self.scaling[0] + draws[2] * (self.scaling[1] - self.scaling[0]) if self.scaling else 1.0
        points, boxes, record = global_transform(points, boxes, rotation=rotation, scale=scale, flip_y=flip)
        moved = dict(target, **extra, boxes=torch.from_numpy(boxes.astype(np.float32)), transform=record.as_dict())
        return torch.from_numpy(points), moved


def build_point_augment(cfg: AugmentConfig) -> Optional[PointAugment]:
    if not any(getattr(cfg, name) for name in POINT_OPS):
        return None
    return PointAugment(cfg.world_rotation_deg, cfg.world_scaling, cfg.world_flip,
                        tuple((cfg.gt_sampling or {}).items()), cfg.gt_min_points)
