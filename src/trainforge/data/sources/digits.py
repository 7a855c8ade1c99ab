"""`digits`: scikit-learn's bundled 8x8 handwritten digits (1797 images, no download)."""
from __future__ import annotations

import torch

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import Pool, TensorSamples
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args

PIXEL_MAX = 16.0  # load_digits stores ink counts 0..16


class DigitsArgs(SourceArgs):
    pass


@SOURCES.register("digits")
def digits(cfg: DataConfig, *, seed: int) -> Pool:
    """x: float32 (1, 8, 8) with raw values 0..16; 10 classes named "0".."9"."""
    parse_args(DigitsArgs, cfg)
    from sklearn.datasets import load_digits  # heavy (sklearn): only this source needs it

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(bunch.target, dtype=torch.int64)
    names = tuple(str(c) for c in bunch.target_names)
    info = DataInfo("classification", "image", (1, 8, 8), "float32", len(names), names)
    return Pool(
        info,
        TensorSamples(x, y),
        labels=y.numpy(),
        rows_read=len(x),
        preprocess={"image_size": 8, "channels": 1},
        value_range=(0.0, PIXEL_MAX),
    )
