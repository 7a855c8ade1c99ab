"""`masks`: semantic segmentation data: data.path holds `images/` and `masks/`, where `masks/<same path>.png` is the
label map of `images/<path>.<ext>`: one 8-bit value per pixel, the index of its class in data.args.classes (a
palette PNG's indices, as VOC's SegmentationClass; a grey PNG's values), 255 where no class is labelled (VOC's void
border: left out of the loss and the metrics).

Every image and mask is read once when the data is built: SHA-256 and header of the image (the image-folder reader),
the mask decoded to check its size and values. Dropped and counted (data_report.json `dropped`, and the console):
corrupt (an image or a mask that does not decode), missing_mask, size_mismatch (a mask of another size than its
image), duplicate (an image of the same bytes as an earlier one; data.clean.dedup). A mask value that is no class
(not below len(classes), not 255) is one line naming the file and its values: such a mask was written for another
class list. A sample is (image float32 (3, S, S) in [0, 1] resized bilinearly, mask int64 (S, S) resized
nearest-neighbour) for S = data.args.image_size, fitted as data.args.resize says (trainforge/geometry.py; keep_aspect,
the default, keeps the aspect with the longer side S and pads bottom and right, the mask with 255: no class); the report counts the pixels of each class.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from PIL import Image

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.formats.manifest import IMAGE_SUFFIXES, OK, read_files
from trainforge.data.pool import DropLog, Pool, Samples, SampleUnreadable
from trainforge.data.sources.common import SOURCES, SourceArgs, class_names_for, parse_args, require_path
from trainforge.data.stages.augment import MaskAugment
from trainforge.errors import UserError
from trainforge.hardware.cpus import available_cpus

WHAT = "a folder with images/ and masks/ (one PNG label map per image, same name)"
REASONS = ("corrupt", "missing_mask", "size_mismatch", "duplicate")
IGNORE = 255  # tasks/segmentation.IGNORE: no class


class MaskArgs(SourceArgs):
    classes: list[str] = Field(min_length=2)  # the class of each mask value, in order (value 0 first)
    image_size: int = Field(256, gt=0, le=4096)
    resize: Literal["keep_aspect", "letterbox", "stretch"] = "keep_aspect"  # how an image is fitted to S x S


class MaskSamples(Samples):
    """The kept image/mask pairs; pair i is read and resized when asked for."""

    def __init__(self, root: str, ids: list[str], masks: list[str], image_size: int,
                 resize: str = "keep_aspect") -> None:
        self.root, self.ids, self.masks, self.image_size, self.resize = root, ids, masks, image_size, resize

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from trainforge.geometry import fit_mask, read_fitted

        try:
            x, fit = read_fitted(os.path.join(self.root, "images", self.ids[index]), self.image_size, self.resize,
                                 pad=True)
            with Image.open(os.path.join(self.root, "masks", self.masks[index])) as img:
                mask = fit_mask(np.asarray(img), fit, IGNORE)
            x = torch.from_numpy(x)
        except Exception as e:  # PIL raises many types for a file that changed since it was read
            raise SampleUnreadable(self.ids[index]) from e
        return x, torch.from_numpy(mask.astype(np.int64))

    def target_augment(self, augment: Any) -> Any:
        return MaskAugment(augment, IGNORE)  # the mask moves with the pixels

    def subset(self, keep: np.ndarray) -> "MaskSamples":
        return MaskSamples(self.root, [self.ids[i] for i in keep], [self.masks[i] for i in keep], self.image_size,
                           self.resize)


@SOURCES.register("masks")
def masks(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: images/ + masks/; args classes (required: the name of each mask value), image_size (256)."""
    a = parse_args(MaskArgs, cfg)
    root = require_path(cfg, WHAT)
    for part in ("images", "masks"):
        if not (root / part).is_dir():
            raise UserError(f"data.path: {root} has no {part}/ folder; point it at {WHAT}", public=True)
    if cfg.normalize == "model":
        raise UserError("data.normalize: 'model' is for image classification; a segmenter normalizes its images "
                        "itself (as its pretrained weights expect): use none or zscore", public=True)
    names = class_names_for([], a.classes)
    if len(names) > IGNORE:
        raise UserError(f"data.args.classes: {len(names)} classes; a mask PNG holds the values 0..254 (255 is "
                        "unlabelled)", public=True)
    images = sorted(p.relative_to(root / "images").as_posix() for p in (root / "images").rglob("*")
                    if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
                    and not any(s.startswith(".") for s in p.relative_to(root).parts))
    drops = DropLog(REASONS)
    pairs = []
    for rel in images:
        mask = Path(rel).with_suffix(".png").as_posix()
        if (root / "masks" / mask).is_file():
            pairs.append((rel, mask))
        else:
            drops.drop("missing_mask", rel)
    reads = read_files([str(root / "images" / rel) for rel, _ in pairs], available_cpus())
    seen: set[str] = set()
    ids, kept_masks = [], []
    pixels = np.zeros(len(names), dtype=np.int64)
    for (rel, mask), (digest, _, width, height, _, verdict) in zip(pairs, reads):
        if verdict != OK or not digest:
            drops.drop("corrupt", rel)
            continue
        try:
            with Image.open(root / "masks" / mask) as img:
                values = np.asarray(img)
        except Exception:  # PIL raises many types for a file that is not an image
            drops.drop("corrupt", f"masks/{mask}")
            continue
        if values.ndim != 2:
            raise UserError(f"{root / 'masks' / mask}: a {values.ndim}-D ({img.mode}) image; a mask is one class "
                            "index per pixel: a grey (L) or palette (P) PNG", public=True)
        if values.shape != (height, width):
            drops.drop("size_mismatch", rel)
            continue
        if cfg.clean.dedup and digest in seen:
            drops.drop("duplicate", rel)
            continue
        seen.add(digest)
        if values.dtype.kind not in "biu":  # a float image (TIFF mode F): no class index, NaN perhaps
            raise UserError(f"{root / 'masks' / mask}: a {img.mode} image of {values.dtype} values; a mask is one "
                            "class index per pixel: a grey (L) or palette (P) PNG", public=True)
        values = values.astype(np.int64)
        outside = values[((values < 0) | (values >= len(names))) & (values != IGNORE)]  # checked before any count
        if outside.size:
            beyond = np.unique(outside)[:5].tolist()
            raise UserError(f"{root / 'masks' / mask}: values {', '.join(map(str, beyond))} are no class of the "
                            f"{len(names)} in data.args.classes (0..{len(names) - 1}, 255 unlabelled); list every "
                            "class, or fix the mask", public=True)
        counts = np.bincount(values[values != IGNORE].reshape(-1), minlength=len(names))
        pixels += counts[:len(names)]
        ids.append(rel)
        kept_masks.append(mask)
    info = DataInfo("segmentation", "image", (3, a.image_size, a.image_size), "float32", len(names), tuple(names))
    return Pool(info, MaskSamples(str(root), ids, kept_masks, a.image_size, a.resize), labels=None,
                rows_read=len(images), drops=drops,
                preprocess={"image_size": a.image_size, "channels": 3, "grayscale": False, "resize": a.resize,
                            "pad": True},  # one size a batch: the canvas is S x S whatever the fit
                notes={"pixels_per_class": {n: int(c) for n, c in zip(names, pixels)}, "resize": a.resize})
