"""`imagefolder`: a folder with one subfolder per class of image files.

Every image file is read once at build time: exact duplicates (SHA-256 of the file bytes) and
files that do not decode completely are dropped and counted. Pixels are then loaded lazily, per
sample, resized to image_size x image_size, as float32 in [0, 1] (under `data.normalize: model`: resized
and cropped as the pretrained model expects, image_size unused).
"""
from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.image_preprocess import ImagePreprocess
from trainforge.data.imageio import read_image, read_model_image
from trainforge.data.pool import DropLog, Pool
from trainforge.data.roots import check_found
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args, require_path
from trainforge.errors import UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def load_image(path: str, image_size: int, grayscale: bool) -> torch.Tensor:
    """float32 (C, S, S) in [0, 1]; C is 1 for grayscale, else 3."""
    return torch.from_numpy(read_image(path, image_size, grayscale))


def decodes(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()  # full decode: catches truncated files that Image.verify() lets through
        return True
    except Exception:  # PIL raises many types (OSError, SyntaxError, ValueError ...) for bad files
        return False


class ImageFiles:
    def __init__(self, paths: list[str], labels: np.ndarray, image_size: int, grayscale: bool,
                 preprocess: Optional[ImagePreprocess] = None) -> None:
        self.paths, self.labels, self.image_size, self.grayscale = paths, labels, image_size, grayscale
        self.preprocess = preprocess

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path = self.paths[index]
        if self.preprocess is None:
            x = load_image(path, self.image_size, self.grayscale)
        else:
            x = torch.from_numpy(read_model_image(path, self.preprocess, self.grayscale))
        return x, torch.tensor(int(self.labels[index]))

    def with_image_preprocess(self, preprocess: ImagePreprocess) -> "ImageFiles":
        """The same files, each read as the pretrained model expects (from the file, with Pillow, as predict does)."""
        return ImageFiles(self.paths, self.labels, self.image_size, self.grayscale, preprocess)


class ImageFolderArgs(SourceArgs):
    image_size: int = Field(32, gt=0)
    grayscale: bool = False


def scan(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class names (sorted subfolder names) and (file, class) pairs in sorted order; hidden files skipped."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = [
        (f, label)
        for label, name in enumerate(classes)
        for f in sorted((root / name).rglob("*"))
        if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES and not f.name.startswith(".")
    ]
    return classes, files


@SOURCES.register("imagefolder")
def imagefolder(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: root/<class>/<image>; args image_size (32), grayscale (false)."""
    a = parse_args(ImageFolderArgs, cfg)
    root = require_path(cfg, "a folder with one subfolder of images per class")
    if not root.is_dir():
        raise UserError(f"data.path: {root} is a file; point it at a folder with one subfolder of images per class",
                        public=True)
    classes, files = scan(root)
    if len(classes) < 2:
        raise UserError(f"data.path: {root} has {len(classes)} class subfolder(s); need at least 2 (one per class)",
                        public=True)
    check_found([f for f, _ in files], root, "data.path")
    drops, seen = DropLog(), set()
    paths, labels = [], []
    for path, label in files:
        ident = path.relative_to(root).as_posix()
        try:
            data = path.read_bytes()
        except OSError:  # unreadable (permissions, vanished): dropped like a file that does not decode
            drops.drop("corrupt", ident)
            continue
        digest = hashlib.sha256(data).digest()
        if cfg.clean.dedup and digest in seen:
            drops.drop("duplicate", ident)
            continue
        seen.add(digest)
        if not decodes(data):
            drops.drop("corrupt", ident)
            continue
        paths.append(str(path))
        labels.append(label)
    label_array = np.asarray(labels, dtype=np.int64)
    channels = 1 if a.grayscale else 3
    shape = (channels, a.image_size, a.image_size)
    info = DataInfo("classification", "image", shape, "float32", len(classes), tuple(classes))
    return Pool(
        info,
        ImageFiles(paths, label_array, a.image_size, a.grayscale),
        labels=label_array,
        rows_read=len(files),
        drops=drops,
        preprocess={"image_size": a.image_size, "channels": channels, "grayscale": a.grayscale},
    )
