"""`torchvision`: an image-classification dataset class from torchvision.datasets, by name.

Nothing is downloaded unless `data.download` is true. When the dataset has its own train/test
split (a `train` flag or a `split` argument) that test split is kept and val is carved from train.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from PIL import Image
from pydantic import Field
from torch.utils.data import Dataset

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.image.preprocess import ImagePreprocess
from trainforge.data.pool import Pool, Samples
from trainforge.confine import check_read, confine, confined_roots, named_paths
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args
from trainforge.errors import UserError, quote


class TorchvisionArgs(SourceArgs):
    name: str
    root: str = "data_cache"
    # resize to image_size x image_size; default: native size (set it when images differ in size, e.g. ImageNet)
    image_size: Optional[int] = Field(None, gt=0)
    kwargs: dict[str, Any] = Field(default_factory=dict)  # extra constructor arguments, e.g. FakeData's size
    test_split: str = "test"  # for classes with a `split` argument; ImageNet calls its held-out part "val"


class TorchvisionSamples(Samples):
    """The concatenation of one or two torchvision datasets, as float32 (C, H, W) in [0, 1]; resized to image_size,
    or with `preprocess` (data.normalize: model) resized and cropped as the pretrained model expects."""

    def __init__(self, parts: list[Dataset], image_size: Optional[int],
                 preprocess: Optional[ImagePreprocess] = None) -> None:
        self.parts, self.image_size, self.preprocess = parts, image_size, preprocess
        self.offsets = np.cumsum([0] + [len(p) for p in parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        part = int(np.searchsorted(self.offsets, index, side="right")) - 1
        image, label = self.parts[part][index - int(self.offsets[part])]
        import torchvision.transforms.v2.functional as TF  # loaded by dataset_class, which built the parts

        if self.preprocess is not None and isinstance(image, Image.Image):  # as the model's own transforms: on PIL
            return torch.from_numpy(self.preprocess.apply_pil(image)), torch.tensor(int(label))
        x = TF.to_dtype(TF.to_image(image), torch.float32, scale=True).as_subclass(torch.Tensor)
        if self.preprocess is not None:
            x = self.preprocess.apply_tensor(x)
        elif self.image_size is not None:
            x = TF.resize(x, [self.image_size, self.image_size], antialias=True)
        return x, torch.tensor(int(label))

    def with_image_preprocess(self, preprocess: ImagePreprocess) -> "TorchvisionSamples":
        return TorchvisionSamples(self.parts, self.image_size, preprocess)


def dataset_class(name: str) -> type:
    # heavy (about 1.9 s, torch._dynamo included): only this source needs torchvision's datasets
    import torchvision.datasets

    cls = getattr(torchvision.datasets, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Dataset)):
        valid = ", ".join(sorted(n for n in torchvision.datasets.__all__ if n[0].isupper()))
        raise UserError(f"data.args.name: {quote(name)} is not a torchvision dataset; choose one of: {valid}", public=True)
    return cls


def targets(ds: Dataset) -> np.ndarray:
    """Every label, without decoding images when the dataset keeps them in a list."""
    for attr in ("targets", "labels"):
        values = getattr(ds, attr, None)
        if values is not None and len(values) == len(ds):
            return np.asarray(values, dtype=np.int64).reshape(-1)
    return np.asarray([int(ds[i][1]) for i in range(len(ds))], dtype=np.int64)


RESERVED_KWARGS = ("root", "download", "train", "split", "transform", "target_transform", "transforms", "loader")


def open_parts(cls: type, a: TorchvisionArgs, download: bool) -> list[Dataset]:
    """[train, test] when the class has its own split, else [everything]."""
    params = inspect.signature(cls).parameters
    reserved = [k for k in a.kwargs if k in RESERVED_KWARGS]
    if reserved:
        raise UserError(f"data.args.kwargs.{reserved[0]}: set by trainforge (data.args.root, data.download, "
                        "data.args.test_split, its own transforms); remove it from data.args.kwargs")
    common = dict(a.kwargs)
    roots = confined_roots()
    if roots is not None:  # a job of the server: every file an argument names is under the data roots
        for field, value in named_paths(a.kwargs, "data.args.kwargs"):
            confine(value, field, roots)
    if "root" in params:
        common["root"] = a.root if roots is None else str(confine(a.root, "data.args.root", roots))
    if "download" in params:
        common["download"] = download
    if "train" in params:
        variants = [{"train": True}, {"train": False}]
    elif "split" in params:
        variants = [{"split": "train"}, {"split": a.test_split}]
    else:
        variants = [{}]
    if roots is not None and "root" in common:
        check_dataset_files(Path(common["root"]))
    try:
        return [cls(**common, **v) for v in variants]
    except (RuntimeError, OSError) as e:  # torchvision's "Dataset not found ..." or a failed download
        if download:
            raise UserError(f"data.args.name: could not download {a.name} into {a.root} ({e})") from None
        if "download" not in params:
            raise UserError(
                f"data.args.root: {a.name} is not in {a.root} and torchvision cannot download it; "
                f"place its files there ({e})"
            ) from None
        raise UserError(
            f"data.args.root: {a.name} is not in {a.root}; set data.download=true to download it "
            "(or point data.args.root at a folder that has it)"
        ) from None
    except (TypeError, ValueError) as e:
        raise UserError(
            f"data.args.kwargs: {a.name} rejected its arguments ({e}); check data.args.kwargs and data.args.test_split"
        ) from None


def check_dataset_files(root: Path) -> None:
    """In a job of the server, before the dataset is opened: every symbolic link under `root` (class folders of an
    ImageFolder, files of any dataset) leads to a place under the data roots. One walk of the folder, links judged
    and not followed: about what torchvision's own listing of a folder dataset costs."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                check_read(path, "data.args.root", root)


@SOURCES.register("torchvision")
def torchvision_source(cfg: DataConfig, *, seed: int) -> Pool:
    """args name (e.g. MNIST, CIFAR10, FakeData), root ("data_cache"), image_size, kwargs, test_split."""
    a = parse_args(TorchvisionArgs, cfg)
    parts = open_parts(dataset_class(a.name), a, cfg.download)
    try:  # arguments the constructor took can still break the first read (FakeData's image_size: x)
        labels = np.concatenate([targets(p) for p in parts])
        samples = TorchvisionSamples(parts, a.image_size)
        first = samples[0][0] if len(labels) else None
    except (TypeError, ValueError, RuntimeError, IndexError, OverflowError) as e:
        raise UserError(f"data.args.kwargs: {a.name} cannot read its samples with these arguments "
                        f"({type(e).__name__}: {str(e)[:200]}); check data.args.kwargs") from None
    if first is None:
        raise UserError(f"data.args.name: {a.name} in {a.root} has no samples")
    classes = getattr(parts[0], "classes", None)
    num_classes = max(len(classes or ()), getattr(parts[0], "num_classes", 0), int(labels.max()) + 1)
    if classes and len(classes) == num_classes:
        names = tuple(str(c[0] if isinstance(c, (tuple, list)) else c) for c in classes)  # ImageNet: synonym tuples
    else:
        names = tuple(str(c) for c in range(num_classes))
    shape = tuple(first.shape)
    info = DataInfo("classification", "image", shape, "float32", num_classes, names)
    test = np.arange(len(parts[0]), len(samples)) if len(parts) == 2 else None
    return Pool(
        info,
        samples,
        labels=labels,
        rows_read=len(samples),
        preprocess={"image_size": shape[-1], "channels": shape[0]},
        test_indices=test,
    )
