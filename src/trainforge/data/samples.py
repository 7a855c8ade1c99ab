"""What a pool is made of, below the pipeline's stages that work on it (data/pool.py gathers them with TensorSamples):
`Samples` (raw (x, y) pairs by index), the `Pool` a source returns, and the `DropLog` of what cleaning dropped. The
cleaning stage (data/stages/clean.py) and the pool both import these, never each other's module: no cycle, not even
through a type.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo

DROP_REASONS = ("duplicate", "corrupt", "nonfinite", "bad_label", "empty_text")
MAX_DROP_EXAMPLES = 5


class SampleUnreadable(Exception):
    """Sample i could not be read after all (an image file that fails to decode at run time): the datasets take
    another sample of the same split in its place, so batches keep their size. The message names the file."""


class Samples:
    """Raw (x, y) pairs by index, whatever the source: what a Pool holds. The pipeline asks every samples object the
    same questions, below, rather than testing its class; the answers here are those of samples that are ready to
    read as they are, and a kind of samples that needs more says so by answering otherwise.

    Samples that read files may also have `with_image_preprocess(spec)` (the same files, read as a pretrained model's
    library reads them) and `runtime_failures()` (what failed to decode while they were read)."""

    # language modelling: the samples are windows of one text, split into contiguous ranges so that no window of the
    # val or test text is trained on; False where they are independent records (conversations): split at random
    contiguous = True

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def before_split(self, pool: Pool, cfg: DataConfig, stored: Optional[dict[str, Any]]) -> Pool:
        """The pool ready to be split: cleaned, and tokenized where the split is of tokens (a corpus cut into
        windows; conversations, so that too-long ones are dropped before it). `stored`: a trained model's
        preprocessing record (eval, compress, resume), whose tokenizer is used as it is."""
        return pool

    def after_split(self, pool: Pool, splits: dict[str, np.ndarray], cfg: DataConfig,
                    stored: Optional[dict[str, Any]]) -> tuple[Pool, dict[str, np.ndarray]]:
        """What needs the split: texts tokenized by a tokenizer fitted on the train split only (like normalization),
        conversations laid into windows, each split's its own (the splits then index the windows)."""
        return pool, splits

    def target_augment(self, augment: Any) -> Any:
        """The train-split augmenter of these samples, given the image one: itself where the target does not move
        with the pixels (a class), or a wrapper that moves it too (a detection sample's boxes, a segmentation mask)."""
        return augment

    def in_memory(self, indices: np.ndarray) -> Optional[torch.Tensor]:
        """The raw inputs of these samples as one tensor, when they are held in memory (normalization statistics
        read them at once); None: read one by one."""
        return None


class DropLog:
    """Counts dropped samples by reason and keeps the first few identifiers of each. `reasons`: those the source
    can drop for (each is in the report, zero or not); the common ones unless a source has its own (chat)."""

    def __init__(self, reasons: tuple[str, ...] = DROP_REASONS) -> None:
        self.counts: dict[str, int] = dict.fromkeys(reasons, 0)
        self.examples: dict[str, list[str]] = {}

    def drop(self, reason: str, ident: str) -> None:
        assert reason in self.counts, reason
        self.counts[reason] += 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < MAX_DROP_EXAMPLES:
            examples.append(ident)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class Pool:
    info: DataInfo
    samples: Samples
    labels: Optional[np.ndarray]  # int64 class per sample (classification); None for language modelling
    rows_read: int  # records the source looked at, before any drop
    drops: DropLog = field(default_factory=DropLog)
    preprocess: dict[str, Any] = field(default_factory=dict)  # source facts needed to serve the model
    value_range: tuple[float, float] = (0.0, 1.0)  # raw pixel scale of images (colour jitter, rotation fill)
    test_indices: Optional[np.ndarray] = None  # the dataset's own test split, when it has one
    notes: dict[str, Any] = field(default_factory=dict)  # extra JSON-able facts for the data report
    rows_kept: Optional[int] = None  # records kept, where samples are not records (chat: packed windows)
    failed_before: Optional[np.ndarray] = None  # samples an earlier run could not read: dropped before the split
    splits: Optional[dict[str, np.ndarray]] = None  # the splits as the source stores them (prepared shards)
    train_shards: Optional[list[int]] = None  # samples per train shard, in train order: read shard by shard
    # data.group_by: each sample's group (a patient id, as text): the split keeps every group's samples together
    groups: Optional[np.ndarray] = None
