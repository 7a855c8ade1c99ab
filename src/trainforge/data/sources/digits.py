"""`digits`: scikit-learn's bundled 8x8 handwritten digits (1797 images, no download)."""
from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import Pool, TensorSamples
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args
from trainforge.errors import UserError

PIXEL_MAX = 16.0  # load_digits stores ink counts 0..16
CSV_IN_PACKAGE = ("datasets", "data", "digits.csv.gz")  # scikit-learn's own copy: 64 pixels then the label


def _digits_csv() -> Path:
    """scikit-learn's bundled file, found without importing scikit-learn (about 1.2 s of every run's start)."""
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = Path(root).joinpath(*CSV_IN_PACKAGE)
        if path.is_file():
            return path
    raise UserError("data.source=digits: scikit-learn's bundled digits.csv.gz was not found; reinstall scikit-learn")


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) float64 0..16, labels (1797,) int64): what `sklearn.datasets.load_digits` returns
    (tests/data/test_data_sources.py compares them), read from the same file."""
    with gzip.open(_digits_csv(), "rt") as f:
        table = np.loadtxt(f, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


class DigitsArgs(SourceArgs):
    pass


@SOURCES.register("digits")
def digits(cfg: DataConfig, *, seed: int) -> Pool:
    """x: float32 (1, 8, 8) with raw values 0..16; 10 classes named "0".."9"."""
    parse_args(DigitsArgs, cfg)
    images, target = load_digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(target, dtype=torch.int64)
    names = tuple(str(c) for c in range(10))
    info = DataInfo("classification", "image", (1, 8, 8), "float32", len(names), names)
    return Pool(
        info,
        TensorSamples(x, y),
        labels=y.numpy(),
        rows_read=len(x),
        preprocess={"image_size": 8, "channels": 1},
        value_range=(0.0, PIXEL_MAX),
    )
