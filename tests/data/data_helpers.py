"""Shared helpers for the data tests (a plain module: conftest names can clash across test folders)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from trainforge.config import DataConfig


def data_cfg(source: str, **fields: Any) -> DataConfig:
    return DataConfig(source=source, **fields)


def write_png(path: Path, rng: np.random.Generator, size: int = 12, color: int | None = None) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    if color is None:
        arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    else:
        arr = np.full((size, size, 3), color, dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return path.read_bytes()


