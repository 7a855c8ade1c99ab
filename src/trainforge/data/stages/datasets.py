"""The split datasets a `DataBundle` holds.

`TrainDataset` is indexed by `(epoch, index)`: the augmentation of that sample is drawn from a
generator seeded by (seed, epoch, index), so it is the same in any process, worker or rank and
after a resume. A plain int index gives the sample without augmentation (to evaluate on the
train split). `EvalDataset` is indexed by int and never augments.

A sample that cannot be read after all (`SampleUnreadable`: an image file that fails to decode) is replaced by
the next readable one of the same split (wrapping around): the same replacement in any process, so batches keep
their size and a resumed run sees what the uninterrupted one saw. The source records the failure.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from trainforge.data.stages.loader import ShardOrder
from trainforge.data.samples import Samples, SampleUnreadable
from trainforge.data.seeding import generator_for

Transform = Callable[[torch.Tensor], torch.Tensor]
Augmenter = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def index_array(indices: Any) -> np.ndarray:
    """A split's sample indices as an integer array, kept in its own integer type (a large corpus' contiguous
    split is int32: its windows' indices cost 4 bytes each, not 8)."""
    a = np.asarray(indices)
    return a if a.dtype.kind in "iu" else a.astype(np.int64)


def read_or_replace(samples: Samples, indices: np.ndarray, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """samples[indices[index]], or the first readable sample after it in `indices` (wrapping around)."""
    for step in range(len(indices)):
        try:
            return samples[int(indices[(index + step) % len(indices)])]
        except SampleUnreadable:
            continue
    raise SampleUnreadable(f"none of the {len(indices)} samples of this split can be read")


class EvalDataset(Dataset):
    def __init__(self, samples: Samples, indices: np.ndarray, normalize: Optional[Transform] = None) -> None:
        self.samples, self.indices, self.normalize = samples, index_array(indices), normalize

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = read_or_replace(self.samples, self.indices, index)
        if self.normalize is not None:
            x = self.normalize(x)
        return x, y


class TrainDataset(Dataset):
    def __init__(
        self,
        samples: Samples,
        indices: np.ndarray,
        *,
        seed: int,
        augment: Optional[Augmenter] = None,
        normalize: Optional[Transform] = None,
        order: Optional[ShardOrder] = None,
    ) -> None:
        self.samples, self.indices = samples, index_array(indices)
        self.seed, self.augment, self.normalize = seed, augment, normalize
        self.order = order  # sharded data: the order its sampler deals out (data/stages/loader.py); else a permutation

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key: Union[tuple[int, int], int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = key if isinstance(key, tuple) else (None, key)
        x, y = read_or_replace(self.samples, self.indices, index)
        if self.augment is not None and epoch is not None:
            g = generator_for("augment", self.seed, int(epoch), int(index))
            if getattr(self.augment, "takes_target", False):  # the target moves with the pixels (boxes, masks)
                x, y = self.augment(x, y, g)
            else:
                x = self.augment(x, g)
        if self.normalize is not None:
            x = self.normalize(x)
        return x, y
