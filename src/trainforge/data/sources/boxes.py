"""What the detection sources (`coco`, `yolo`, `voc`) share once each has read its annotation format: the images
and their boxes, cleaned with reasons, as lazily read samples.

A source parses its files into `Annotated` records (one per image: its file, its boxes in pixels of the file as
stored, x1 y1 x2 y2, and each box's class index, 1-based: class 0 is the background, as torchvision's detectors
count) and hands them to `box_pool`, which reads every image file once (SHA-256, header, a decode where the file may
be cut short: the image-folder reader's), then drops and counts:

    images: corrupt (does not decode), missing_file (named by the annotations, not on disk), duplicate (the same
            bytes as an earlier image; data.clean.dedup), no_annotations (an image without boxes, when
            data.args.empty_images is drop; kept as a negative by default and counted under `negatives`);
    boxes:  out_of_bounds (a box reaching outside its image: clipped to it and kept), zero_area (no width or height,
            after clipping), unknown_category (a class the annotations do not declare, when
            data.args.unknown_categories is drop; one line naming the file otherwise).

Every reason is a key of data_report.json's `dropped` (zero or not); `box_reasons` lists those that count boxes, so
the console line can say images and boxes apart; `boxes` counts those the annotations list (read), those kept, and
those of images dropped whole (in_dropped_images: not counted again by reason). A sample is (image float32 (3, H, W) in [0, 1], {"boxes": float32
(n, 4) in pixels of that image, "labels": int64 (n,)}): the image fitted to data.args.image_size S as data.args.resize
says (data/image/geometry.py: keep_aspect, the default, scales the longer side to S and keeps the aspect, so a wide
frame is H x S; letterbox centres that on an S x S canvas; stretch squeezes it to S x S), its boxes mapped with it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np
import torch
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.formats.manifest import OK, read_files
from trainforge.data.pool import DropLog, Pool, Samples, SampleUnreadable
from trainforge.data.sources.common import SourceArgs
from trainforge.data.stages.augment import BoxAugment
from trainforge.errors import UserError, quote
from trainforge.hardware.cpus import available_cpus

BACKGROUND = "__background__"  # class 0 of a detector (torchvision's name for it)
IMAGE_REASONS = ("corrupt", "missing_file", "duplicate", "no_annotations")
BOX_REASONS = ("out_of_bounds", "zero_area", "unknown_category")
UNKNOWN = -1  # the label of a box whose class the annotations do not declare


class BoxArgs(SourceArgs):
    """data.args of every detection source."""

    image_size: int = Field(320, gt=0, le=4096)  # the longer side of the model's input (S x S at most)
    resize: Literal["keep_aspect", "letterbox", "stretch"] = "keep_aspect"  # how an image is fitted to it
    empty_images: Literal["keep", "drop"] = "keep"  # images without boxes: negatives to learn from, or dropped
    unknown_categories: Literal["error", "drop"] = "error"  # boxes of undeclared classes: one line, or dropped


@dataclass
class Annotated:
    """One image as its annotations describe it. `file`: its path relative to the image folder ('/'-separated);
    `boxes`: (x1, y1, x2, y2) in pixels of the file; `labels`: each box's class index (1-based), UNKNOWN for a class
    the annotations do not declare; `where`: how to name this image's annotations in a message."""

    file: str
    where: str
    boxes: list[tuple[float, float, float, float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    normalized: bool = False  # boxes in fractions of the image's size (YOLO), turned into pixels once it is read


class BoxSamples(Samples):
    """The kept images and their cleaned boxes; image i is read and resized when asked for."""

    def __init__(self, root: str, ids: list[str], boxes: list[np.ndarray], labels: list[np.ndarray],
                 sizes: np.ndarray, image_size: int, resize: str = "keep_aspect") -> None:
        self.root, self.ids, self.boxes, self.labels, self.sizes = root, ids, boxes, labels, sizes
        self.image_size, self.resize = image_size, resize

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        from trainforge.geometry import read_fitted, to_model

        try:
            x, fit = read_fitted(os.path.join(self.root, self.ids[index]), self.image_size, self.resize)
        except Exception as e:  # PIL raises many types for a file that changed since it was read
            raise SampleUnreadable(self.ids[index]) from e
        boxes = torch.from_numpy(to_model(self.boxes[index], fit)).reshape(-1, 4)
        return torch.from_numpy(x), {"boxes": boxes, "labels": torch.from_numpy(self.labels[index]).reshape(-1)}

    def target_augment(self, augment: Any) -> Any:
        return BoxAugment(augment)  # the boxes move with the pixels

    def subset(self, keep: np.ndarray) -> "BoxSamples":
        return BoxSamples(self.root, [self.ids[i] for i in keep], [self.boxes[i] for i in keep],
                          [self.labels[i] for i in keep], self.sizes[keep], self.image_size, self.resize)


def box_pool(cfg: DataConfig, args: BoxArgs, image_root: Path, images: list[Annotated],
             class_names: list[str], notes: Optional[dict[str, Any]] = None) -> Pool:
    """The cleaned pool of `images` (see the module doc); `class_names` without the background."""
    if cfg.normalize == "model":
        raise UserError("data.normalize: 'model' is for image classification; a torchvision detector normalizes "
                        "its images itself (as its pretrained weights expect): use none or zscore", public=True)
    drops = DropLog(IMAGE_REASONS + BOX_REASONS)
    present, missing = [], []
    for a in images:
        inside(a.file, a.where, image_root)
        (present if (image_root / a.file).is_file() else missing).append(a)
    for a in missing:
        drops.drop("missing_file", a.file)
    reads = list(read_files([str(image_root / a.file) for a in present], available_cpus()))
    seen: set[str] = set()
    ids, boxes, labels, sizes = [], [], [], []
    negatives = 0
    with_dropped = sum(len(a.boxes) for a in missing)  # boxes of images dropped whole: not counted box by box
    for a, (digest, _, width, height, _, verdict) in zip(present, reads):
        if verdict != OK or not digest:
            drops.drop("corrupt", a.file)
            with_dropped += len(a.boxes)
            continue
        if a.normalized:  # YOLO: fractions of the image's width and height
            a.boxes = [(x1 * width, y1 * height, x2 * width, y2 * height) for x1, y1, x2, y2 in a.boxes]
        if cfg.clean.dedup and digest in seen:
            drops.drop("duplicate", a.file)
            with_dropped += len(a.boxes)
            continue
        seen.add(digest)
        kept_boxes, kept_labels = _clean_boxes(a, width, height, drops, args, class_names)
        if not kept_boxes:
            if args.empty_images == "drop":
                drops.drop("no_annotations", a.file)
                continue
            negatives += 1
        ids.append(a.file)
        boxes.append(np.asarray(kept_boxes, dtype=np.float32).reshape(-1, 4))
        labels.append(np.asarray(kept_labels, dtype=np.int64))
        sizes.append((width, height))
    names = (BACKGROUND, *class_names)
    per_class = np.bincount(np.concatenate([np.zeros(0, np.int64), *labels]), minlength=len(names))
    info = DataInfo("detection", "image", (3, args.image_size, args.image_size), "float32", len(names), names)
    samples = BoxSamples(str(image_root), ids, boxes, labels, np.asarray(sizes, dtype=np.float64).reshape(-1, 2),
                         args.image_size, args.resize)
    report = {"box_reasons": list(BOX_REASONS),
              "boxes": {"read": sum(len(a.boxes) for a in images), "kept": int(per_class.sum()),
                        "in_dropped_images": with_dropped,
                        "per_class": {n: int(c) for n, c in zip(class_names, per_class[1:])}},
              "negatives": negatives, **(notes or {})}
    return Pool(info, samples, labels=None, rows_read=len(images), drops=drops,
                preprocess={"image_size": args.image_size, "channels": 3, "grayscale": False, "resize": args.resize},
                notes={**report, "resize": args.resize})


def _clean_boxes(a: Annotated, width: int, height: int, drops: DropLog, args: BoxArgs,
                 class_names: list[str]) -> tuple[list[tuple[float, ...]], list[int]]:
    kept_boxes, kept_labels = [], []
    for k, ((x1, y1, x2, y2), label) in enumerate(zip(a.boxes, a.labels)):
        name = f"{a.file} box {k}"
        if label == UNKNOWN:
            if args.unknown_categories == "error":  # the source raises for it unless drop: never reached
                raise AssertionError(name)
            drops.drop("unknown_category", name)
            continue
        clipped = (min(max(x1, 0.0), width), min(max(y1, 0.0), height), min(max(x2, 0.0), width),
                   min(max(y2, 0.0), height))
        if clipped[2] - clipped[0] <= 0 or clipped[3] - clipped[1] <= 0:
            drops.drop("zero_area", name)
            continue
        if clipped != (x1, y1, x2, y2):
            drops.drop("out_of_bounds", name)
        assert 1 <= label <= len(class_names), (name, label)
        kept_boxes.append(clipped)
        kept_labels.append(label)
    return kept_boxes, kept_labels


MAX_NAME_CHARS = 1024  # an image's path in an annotation file (Linux allows 4096 bytes, 255 a component)


def check_name(name: str, where: str) -> None:
    """An image name from an annotation file that can be a path at all: no NUL, not absurdly long (one line)."""
    if "\x00" in name or len(name) > MAX_NAME_CHARS or any(len(part) > 255 for part in name.split("/")):
        raise UserError(f"{where}: {quote(name[:80])} is not a file name (a NUL byte, a part over 255 characters, or "
                        f"over {MAX_NAME_CHARS} in all); name the image's file relative to the images folder",
                        public=True)


def inside(file: str, where: str, root: Path) -> None:
    """An image the annotations name lies inside `root` (no absolute path, no '..'): a hostile annotation file
    never makes trainforge read, or report on, a file elsewhere."""
    check_name(file, where)
    parts = Path(file).parts
    if not file or Path(file).is_absolute() or ".." in parts or os.path.normpath(file).startswith(".."):
        raise UserError(f"{where}: image {quote(file)} is not a path inside {root}; name images relative to that folder",
                        public=True)


def number(value: Any, where: str, what: str, fix: str) -> float:
    """`value` as a finite float, or a UserError naming `where`, `what` and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: {what} must be a finite number, got {quote(value)}; {fix}", public=True)
    return float(value)


def unknown_category(where: str, category: Any, declared: str, args: BoxArgs) -> int:
    """UNKNOWN for a box of an undeclared class under unknown_categories: drop; else the one-line error."""
    if args.unknown_categories == "drop":
        return UNKNOWN
    raise UserError(f"{where}: category {quote(category)} is not among {declared}; declare it, fix the annotation, or "
                    "set data.args.unknown_categories: drop to drop (and count) such boxes", public=True)
