"""The split datasets a `DataBundle` holds.

`TrainDataset` is indexed by `(epoch, index)`: the augmentation of that sample is drawn from a
generator seeded by (seed, epoch, index), so it is the same in any process, worker or rank and
after a resume. A plain int index gives the sample without augmentation (to evaluate on the
train split). `EvalDataset` is indexed by int and never augments.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import numpy as np
import torch
from torch.utils.data import Dataset

from trainforge.data.pool import Samples
from trainforge.data.seeding import generator_for

Transform = Callable[[torch.Tensor], torch.Tensor]
Augmenter = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class EvalDataset(Dataset):
    def __init__(self, samples: Samples, indices: np.ndarray, normalize: Optional[Transform] = None) -> None:
        self.samples, self.indices, self.normalize = samples, np.asarray(indices, dtype=np.int64), normalize

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.samples[int(self.indices[index])]
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
    ) -> None:
        self.samples, self.indices = samples, np.asarray(indices, dtype=np.int64)
        self.seed, self.augment, self.normalize = seed, augment, normalize

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key: Union[tuple[int, int], int]) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = key if isinstance(key, tuple) else (None, key)
        x, y = self.samples[int(self.indices[index])]
        if self.augment is not None and epoch is not None:
            x = self.augment(x, generator_for("augment", self.seed, int(epoch), int(index)))
        if self.normalize is not None:
            x = self.normalize(x)
        return x, y
