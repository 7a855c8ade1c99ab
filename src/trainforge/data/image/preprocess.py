"""`data.normalize: model`: the pretrained model's own image preprocessing, resolved once and stored with the run.

    spec = resolve_image_preprocess(cfg.data.from_model)     # timm's data config, the HF image processor,
    preprocess["image_preprocess"] = spec.to_json()          # or torchvision weights' transforms()
    spec = ImagePreprocess.from_json(stored["image_preprocess"])   # eval, compress, resume, predict: no reload
    arr = spec.apply_pil(img)                               # a PIL image -> float32 (C, H, W) in [0, 1]

The steps are those of the three libraries' eval transforms: resize (the shorter side to `resize_size[0]`, or
exactly to `resize_size` = [h, w]) with the model's interpolation, centre crop to `crop_size`, then the model's
mean and std (applied by `trainforge.data.stages.normalize`, kind "model"). Files are resized with Pillow on 8-bit
pixels as timm, torchvision and the transformers image processors do with PIL images; samples a source holds as
tensors (digits, synthetic images) with torchvision's tensor resize (`apply_tensor`).

This module imports neither torch nor the model libraries at import time: `trainforge predict` reads images
through `apply_pil` with numpy and Pillow only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np
from PIL import Image

from trainforge.errors import UserError
from trainforge.registry import Registry

if TYPE_CHECKING:
    import torch

    from trainforge.config import FromModelConfig

FIELD = "data.normalize"
PIL_FILTERS = {"nearest": Image.Resampling.NEAREST, "nearest-exact": Image.Resampling.NEAREST,
               "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
               "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING, "lanczos": Image.Resampling.LANCZOS}
TENSOR_FILTERS = ("nearest", "nearest-exact", "bilinear", "bicubic")  # what torchvision resizes tensors with
CROP_ROUNDING = ("round", "floor")  # torchvision/timm: int(round((size - crop) / 2)); transformers: floor


@dataclass(frozen=True)
class ImagePreprocess:
    """resize_size: [s] (shorter side to s, the other in proportion, as torchvision's Resize(int)) or [h, w];
    crop_size: [h, w] or None; mean, std: per channel, of pixels in [0, 1]; origin: where the values came from."""

    resize_size: tuple[int, ...]
    crop_size: Optional[tuple[int, int]]
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    origin: str
    crop_rounding: str = "round"
    note: str = ""  # why a value is not quite the model's own (a weights file: its arch's DEFAULT transforms)

    def __post_init__(self) -> None:
        ok = (len(self.resize_size) in (1, 2) and all(_is_size(s) for s in self.resize_size)
              and (self.crop_size is None or (len(self.crop_size) == 2 and all(_is_size(s) for s in self.crop_size)))
              and self.interpolation in PIL_FILTERS and self.crop_rounding in CROP_ROUNDING
              and len(self.mean) == len(self.std) and len(self.mean) in (1, 3)
              and all(isinstance(v, (int, float)) and math.isfinite(v) for v in self.mean)
              and all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in self.std))
        if not ok:
            raise ValueError(f"not a valid image preprocessing: {self.to_json()}")
        if self.crop_size is None and len(self.resize_size) == 1:
            raise ValueError("resizing the shorter side without a crop gives images of different sizes")

    @property
    def channels(self) -> int:
        return len(self.mean)

    @property
    def output_hw(self) -> tuple[int, int]:
        if self.crop_size is not None:
            return self.crop_size
        h, w = self.resize_size
        return h, w

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return (self.channels, *self.output_hw)

    def to_json(self) -> dict[str, Any]:
        out = {"resize_size": list(self.resize_size), "crop_size": None if self.crop_size is None else list(self.crop_size),
               "crop_rounding": self.crop_rounding, "interpolation": self.interpolation, "mean": list(self.mean),
               "std": list(self.std), "origin": self.origin}
        return {**out, "note": self.note} if self.note else out

    @classmethod
    def from_json(cls, data: Any) -> "ImagePreprocess":
        """ValueError for a damaged record (serving turns it into one line naming the artifact)."""
        try:
            crop = data["crop_size"]
            return cls(tuple(data["resize_size"]), None if crop is None else tuple(crop), data["interpolation"],
                       tuple(data["mean"]), tuple(data["std"]), str(data.get("origin", "")),
                       data.get("crop_rounding", "round"), str(data.get("note", "")))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"incomplete image preprocessing record ({type(e).__name__}: {e})") from None

    def resized_hw(self, height: int, width: int) -> tuple[int, int]:
        """The size after the resize step, by torchvision's rule for an int size (transformers' is the same)."""
        if len(self.resize_size) == 2:
            h, w = self.resize_size
            return h, w
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.resize_size[0], int(self.resize_size[0] * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def crop_offsets(self, height: int, width: int) -> tuple[int, int]:
        """(top, left) of the centre crop; negative where the crop is larger (padded with zeros, as the libraries do)."""
        assert self.crop_size is not None
        return tuple(_offset(size, crop, self.crop_rounding) for size, crop in zip((height, width), self.crop_size))

    def apply_pil(self, img: Image.Image, grayscale: bool = False) -> np.ndarray:
        """An opened image -> float32 (C, H, W) in [0, 1]: gray when `grayscale` (replicated to 3 channels when the
        model takes 3), resized, cropped."""
        if grayscale or self.channels == 1:
            img = img.convert("L")
        img = img.convert("L" if self.channels == 1 else "RGB")
        h, w = self.resized_hw(img.height, img.width)
        if (h, w) != (img.height, img.width):
            img = img.resize((w, h), PIL_FILTERS[self.interpolation])
        if self.crop_size is not None:
            top, left = self.crop_offsets(h, w)
            ch, cw = self.crop_size
            img = img.crop((left, top, left + cw, top + ch))  # outside the image: zeros
        arr = np.asarray(img, dtype=np.float32) / 255.0
        return np.ascontiguousarray(arr[None] if self.channels == 1 else arr.transpose(2, 0, 1))

    def apply_tensor(self, x: "torch.Tensor") -> "torch.Tensor":
        """A (C, H, W) float tensor on any pixel scale -> resized and cropped with torchvision (antialiased), a single
        channel repeated when the model takes 3. The same steps as `apply_pil`, on tensors."""
        import torch.nn.functional as F
        import torchvision.transforms.v2.functional as TF

        h, w = self.resized_hw(x.shape[-2], x.shape[-1])
        if (h, w) != tuple(x.shape[-2:]):
            x = TF.resize(x, [h, w], interpolation=TF.InterpolationMode(self.interpolation), antialias=True)
        if self.crop_size is not None:
            top, left = self.crop_offsets(h, w)
            ch, cw = self.crop_size
            pad = (max(-left, 0), max(left + cw - w, 0), max(-top, 0), max(top + ch - h, 0))
            if any(pad):
                x = F.pad(x, pad)
                top, left = top + pad[2], left + pad[0]
            x = x[..., top : top + ch, left : left + cw]
        if x.shape[0] == 1 and self.channels == 3:
            x = x.repeat(3, 1, 1)
        return x.contiguous()

    def describe(self) -> dict[str, Any]:
        """The data report's note."""
        return {**self.to_json(), "input_shape": list(self.output_shape)}


def _is_size(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _offset(size: int, crop: int, rounding: str) -> int:
    if crop > size:  # padded by (crop - size) // 2 before (torchvision); transformers' floor gives the same
        return -((crop - size) // 2) if rounding == "round" else (size - crop) // 2
    return int(round((size - crop) / 2.0)) if rounding == "round" else (size - crop) // 2


# ---- resolution: the values the model's own library gives -------------------------------------------------

Resolver = Callable[["FromModelConfig"], ImagePreprocess]
FAMILIES: Registry[Resolver] = Registry("pretrained model family", "data.from_model.family")


def resolve_image_preprocess(from_model: "FromModelConfig") -> ImagePreprocess:
    """The preprocessing `from_model` expects; UserError (naming data.normalize or data.from_model) otherwise."""
    return FAMILIES.get(from_model.family)(from_model)


@FAMILIES.register("timm")
def timm_preprocess(from_model: "FromModelConfig") -> ImagePreprocess:
    """timm's `resolve_data_config` of the architecture's pretrained config (metadata: no weights are read), as
    `timm.data.create_transform(**config)` (its eval transform) applies it."""
    import timm
    from timm.data import resolve_data_config

    arch = from_model.source
    if not timm.is_model(arch):
        raise UserError(f"data.from_model.source: {arch!r} is not a timm model; name one timm.list_models() knows",
                        public=True)
    pretrained = timm.get_pretrained_cfg(arch)
    cfg = resolve_data_config({}, pretrained_cfg=pretrained.to_dict() if pretrained is not None else {})
    _, height, width = cfg["input_size"]
    crop_pct = cfg.get("crop_pct") or timm.data.DEFAULT_CROP_PCT
    scale = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    mode = cfg.get("crop_mode") or "center"
    if mode == "squash":
        resize: tuple[int, ...] = scale
    elif mode == "center" and height == width:
        resize = (scale[0],)
    else:
        raise UserError(f"{FIELD}: model: timm's crop_mode {mode!r} with input size {height}x{width} of {arch} is "
                        "not reproduced by trainforge; use data.normalize zscore", public=True)
    return ImagePreprocess(resize, (height, width), _interpolation(cfg["interpolation"]), tuple(cfg["mean"]),
                           tuple(cfg["std"]), f"timm {arch} data config")


WEIGHT_SET_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@FAMILIES.register("torchvision")
def torchvision_preprocess(from_model: "FromModelConfig") -> ImagePreprocess:
    """`weights.transforms()` of the weight set (metadata: no weights are read). A weights file, or no weights,
    takes the transforms of the architecture's DEFAULT weight set."""
    from torchvision.models import get_model_weights

    arch, name = from_model.source, from_model.weights
    try:
        weight_sets = get_model_weights(arch)
    except (ValueError, KeyError):
        raise UserError(f"data.from_model.source: {arch!r} is not a torchvision model with weight sets; "
                        "name one (resnet18, resnet50, ...)", public=True) from None
    note = ""
    if name is None or not set(name) <= WEIGHT_SET_CHARS:
        note = (f"{'weights from a file' if name else 'no weight set named'}: the transforms of {arch}'s DEFAULT "
                "weight set")
        name = "DEFAULT"
    try:
        weights = weight_sets[name]
    except KeyError:
        valid = ", ".join(weight_sets.__members__)
        raise UserError(f"data.from_model.weights: {name!r} is not a weight set of {arch}; choose one of: {valid}",
                        public=True) from None
    t = weights.transforms()
    resize, crop = tuple(int(s) for s in t.resize_size), tuple(int(s) for s in t.crop_size)
    crop = crop * 2 if len(crop) == 1 else crop
    return ImagePreprocess(resize, crop, _interpolation(t.interpolation.value), tuple(t.mean), tuple(t.std),
                           f"torchvision {type(weights).__name__}.{weights.name}", note=note)


# transformers image processors whose resize is their own: the rule each documents, as a function
# (processor, shortest_edge) -> (resize_size, crop_size)
HF_RESIZE_RULES: dict[str, Callable[[Any, int], tuple[tuple[int, ...], tuple[int, int]]]] = {
    # ConvNeXT (also the processor of microsoft/resnet-*): below 384 the shorter side to shortest_edge / crop_pct,
    # then a centre crop to shortest_edge; from 384 on a warp to shortest_edge x shortest_edge
    "ConvNextImageProcessor": lambda p, s: ((int(s / p.crop_pct),), (s, s)) if s < 384 else ((s, s), (s, s)),
}
HF_GENERIC_BACKENDS = ("TorchvisionBackend", "PilBackend")


@FAMILIES.register("hf")
def hf_preprocess(from_model: "FromModelConfig") -> ImagePreprocess:
    """The values of `AutoImageProcessor.from_pretrained(source)` (offline first): size, crop_size,
    do_center_crop, resample, rescale_factor, image_mean and image_std."""
    from transformers import AutoImageProcessor

    from trainforge.hub import from_hub

    source = from_model.source
    proc = from_hub(AutoImageProcessor.from_pretrained, source, "image processor", field="data.from_model.source",
                    trust_remote_code=from_model.trust_remote_code)
    kind = type(proc).__name__
    rule = HF_RESIZE_RULES.get(kind.removesuffix("Pil"))
    if rule is None and not _generic_hf_processor(type(proc)):
        raise UserError(f"{FIELD}: model: {kind} of {source!r} resizes in a way of its own that trainforge does not "
                        "reproduce; use data.normalize zscore", public=True)
    if not getattr(proc, "do_resize", True):
        raise UserError(f"{FIELD}: model: the image processor of {source!r} does not resize (do_resize false), so "
                        "images of different sizes stay so; use data.normalize zscore", public=True)
    size = _size_fields(proc.size)
    crop: Optional[tuple[int, int]] = None
    if rule is not None and size.get("shortest_edge"):
        resize, crop = rule(proc, size["shortest_edge"])
    elif set(size) == {"shortest_edge"}:
        resize = (size["shortest_edge"],)
    elif set(size) == {"height", "width"}:
        resize = (size["height"], size["width"])
    else:
        raise UserError(f"{FIELD}: model: the image processor of {source!r} has size {size}; trainforge reproduces "
                        "{shortest_edge} or {height, width}; use data.normalize zscore", public=True)
    if getattr(proc, "do_center_crop", False):
        crop_fields = _size_fields(proc.crop_size)
        crop = (crop_fields["height"], crop_fields["width"])
    if crop is None and len(resize) == 1:
        raise UserError(f"{FIELD}: model: the image processor of {source!r} resizes the shorter side without a crop, "
                        "so images of different shapes stay so; use data.normalize zscore", public=True)
    # the processor scales pixels by rescale_factor before normalizing; on [0, 1] pixels that is a mean and std
    # scaled by 1 / (255 * rescale_factor) (1 when it rescales by 1/255, as all do)
    factor = 255.0 * (float(proc.rescale_factor) if getattr(proc, "do_rescale", True) else 1.0)
    normalizes = getattr(proc, "do_normalize", True)
    mean = proc.image_mean if normalizes else (0.0, 0.0, 0.0)
    std = proc.image_std if normalizes else (1.0, 1.0, 1.0)
    mean, std = _per_channel(mean), _per_channel(std)
    if not math.isclose(factor, 1.0, rel_tol=1e-9):
        mean, std = tuple(m / factor for m in mean), tuple(s / factor for s in std)
    return ImagePreprocess(resize, crop, _hf_interpolation(proc.resample), mean, std, f"hf {source} {kind}",
                           crop_rounding="floor")


def _generic_hf_processor(cls: type) -> bool:
    """A processor that resizes and crops with its backend's own (generic) steps."""
    base = next((c for c in cls.__mro__ if c.__name__ in HF_GENERIC_BACKENDS), None)
    return base is not None and all(getattr(cls, m) is getattr(base, m) for m in ("resize", "center_crop", "_preprocess"))


def _hf_interpolation(resample: Any) -> str:
    """A processor's resample: a PIL filter number (PILImageResampling), a torchvision InterpolationMode, or None
    (both backends then resize bilinearly)."""
    if resample is None:
        return "bilinear"
    value = getattr(resample, "value", resample)
    return _interpolation(value if isinstance(value, str) else Image.Resampling(int(value)).name)


def _size_fields(size: Any) -> dict[str, int]:
    """The set fields of a transformers size (a SizeDict dataclass or a plain dict)."""
    items = size.items() if isinstance(size, dict) else vars(size).items()
    return {k: int(v) for k, v in items if v is not None}


def _per_channel(values: Any) -> tuple[float, ...]:
    values = tuple(float(v) for v in (values if isinstance(values, (list, tuple)) else [values]))
    return values * 3 if len(values) == 1 else values


def _interpolation(name: str) -> str:
    name = str(name).lower()
    if name not in PIL_FILTERS:
        raise UserError(f"{FIELD}: model: interpolation {name!r} is not one trainforge reproduces "
                        f"({', '.join(PIL_FILTERS)}); use data.normalize zscore", public=True)
    return name
