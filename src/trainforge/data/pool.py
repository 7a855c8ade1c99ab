"""What a data source hands to the common pipeline: every kept sample, before split and transforms.

A source returns a `Pool`. Its `samples` are raw `(x, y)` pairs by index (eager `TensorSamples`, or a lazy class
that loads/generates sample `i` on demand), a `Samples` that tells the pipeline what it needs (its hooks); the
pipeline splits it by index, fits normalization on the train part and wraps it into datasets. The types themselves
live in data/samples.py, below the cleaning stage that TensorSamples calls; sources import them from here.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.samples import (DROP_REASONS, MAX_DROP_EXAMPLES, DropLog, Pool, SampleUnreadable,  # noqa: F401
                                     Samples)
from trainforge.data.stages.clean import clean_tensor_pool


class TensorSamples(Samples):
    """Samples held in memory: `x[i]`, `y[i]`; `ids[i]` names sample i in the data report."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, ids: Optional[list[str]] = None) -> None:
        assert len(x) == len(y), (len(x), len(y))
        self.x, self.y = x, y
        self.ids = ids if ids is not None else [f"row {i}" for i in range(len(x))]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    def subset(self, keep: np.ndarray) -> "TensorSamples":
        keep_t = torch.as_tensor(keep, dtype=torch.long)
        return TensorSamples(self.x[keep_t], self.y[keep_t], [self.ids[i] for i in keep])

    def before_split(self, pool: Pool, cfg: DataConfig, stored: Optional[dict[str, Any]]) -> Pool:
        return clean_tensor_pool(pool, cfg.clean)  # non-finite rows and duplicates dropped

    def in_memory(self, indices: np.ndarray) -> Optional[torch.Tensor]:
        return self.x[torch.as_tensor(indices)]
