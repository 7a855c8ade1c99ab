"""Data loaders whose train order is a pure function of (seed, epoch): exact resume, any worker count.

    sampler = PositionBatchSampler(len(bundle.train), seed=cfg.seed, micro_batch_size=16,
                                   global_batch_size=64, rank=rank, world_size=world_size)
    loader = make_train_loader(bundle.train, sampler, num_workers=2, pin_memory=True)
    for epoch in range(start_epoch, epochs):
        sampler.set_position(epoch, start_sample if epoch == start_epoch else 0)
        for x, y in loader: ...   # micro-batches of this rank

Iterating never advances the sampler by itself: call `set_position` before each epoch.
"""
from __future__ import annotations

import signal
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from trainforge.config import TrainConfig
from trainforge.data.seeding import generator_for
from trainforge.errors import UserError
from trainforge.hardware.cpus import available_cpus
from trainforge.processes import die_with_parent

Key = tuple[int, int]  # (epoch, index): what TrainDataset is indexed by


def steps_per_epoch(num_samples: int, global_batch_size: int) -> int:
    """Optimizer steps in one epoch (the last partial batch is dropped)."""
    steps = num_samples // global_batch_size
    if steps == 0:
        raise UserError(
            f"train.global_batch_size: {global_batch_size} is larger than the training split "
            f"({num_samples} samples); lower train.global_batch_size or add data",
            public=True,
        )
    return steps


def run_steps(train: TrainConfig, train_samples: int) -> int:
    """Optimizer steps of a whole run: `train.max_steps` when set, else `train.epochs` epochs of `train_samples`
    (what one epoch reads over all ranks) at `train.global_batch_size`. The one count of the resolver and the
    planner."""
    return train.max_steps or train.epochs * steps_per_epoch(train_samples, train.global_batch_size)


def epoch_order(num_samples: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's permutation of sample indices, from a generator seeded by (seed, epoch)."""
    # int32 below 2**31 samples: half the memory of a large corpus' order, and the same permutation as int64
    dtype = torch.int32 if num_samples < 2**31 else torch.int64
    return torch.randperm(num_samples, generator=generator_for("order", seed, epoch), dtype=dtype)


class PositionBatchSampler(Sampler[list[Key]]):
    """Train order as a pure function of (seed, epoch): permutation from a Generator seeded with
    hash(seed, epoch). Each micro-step consumes micro_batch_size * world_size samples of that order;
    rank r takes its contiguous slice of micro_batch_size. Only the first
    steps_per_epoch * global_batch_size samples of the order are used (drop_last).
    Yields lists of (epoch, index) keys."""

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int,
        micro_batch_size: int,
        global_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        assert 0 <= rank < world_size, (rank, world_size)
        self.num_samples, self.seed = num_samples, seed
        self.global_batch_size, self.rank, self.world_size = global_batch_size, rank, world_size
        self.steps_per_epoch = steps_per_epoch(num_samples, global_batch_size)
        self.samples_per_epoch = self.steps_per_epoch * global_batch_size
        self.set_micro_batch_size(micro_batch_size)
        self.epoch, self.start_sample = 0, 0

    def set_micro_batch_size(self, n: int) -> None:
        """Change the micro-batch (OOM recovery shrinks it); the global batch and the order stay."""
        if n <= 0 or self.global_batch_size % (n * self.world_size):
            raise UserError(
                f"train.micro_batch_size: {n} x world size {self.world_size} must divide "
                f"train.global_batch_size ({self.global_batch_size})"
            )
        self.micro_batch_size = n

    def set_position(self, epoch: int, start_sample: int = 0) -> None:
        """Continue at `start_sample` samples (all ranks together) into `epoch`'s order."""
        stride = self.micro_batch_size * self.world_size
        if not 0 <= start_sample <= self.samples_per_epoch or start_sample % stride:
            raise ValueError(
                f"start_sample {start_sample} must be a multiple of {stride} in [0, {self.samples_per_epoch}]"
            )
        self.epoch, self.start_sample = epoch, start_sample

    def __len__(self) -> int:
        return (self.samples_per_epoch - self.start_sample) // (self.micro_batch_size * self.world_size)

    def __iter__(self) -> Iterator[list[Key]]:
        epoch, micro = self.epoch, self.micro_batch_size
        order = epoch_order(self.num_samples, self.seed, epoch)  # a tensor: a list of a large corpus' windows
        first = self.start_sample + self.rank * micro           # would cost ~40 bytes each
        for start in range(first, self.samples_per_epoch, micro * self.world_size):
            yield [(epoch, i) for i in order[start : start + micro].tolist()]


class ShardOrder:
    """The train split stored as shards (`data.source: webdataset`): `sizes[k]` samples each, shard k holding
    the consecutive train indices after shard k-1's. The order contract (docs/data.md, "Streaming"):

    - epoch e permutes the shards with a generator seeded by (seed, e), the same permutation for any world size;
    - rank r of W reads the shards at positions r, r+W, r+2W, ... of it: disjoint shards, whole shards;
    - a shard's samples come in a permutation seeded by (seed, e, shard), the same for any world size and rank;
    - every rank reads `rank_samples(W)` samples an epoch: the sum of the K // W smallest shards, which each
      rank is sure to hold whatever the permutation (equal steps on all ranks); the rest of its shards waits
      for the next epoch's permutation.

    So a rank's sample stream is a pure function of (seed, epoch, rank, W): a run resumes at any position, with
    any number of workers, by skipping whole shards and then part of one shard's permutation."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def rank_samples(self, world_size: int) -> int:
        shards = len(self.sizes)
        if shards < world_size:
            raise UserError(f"data.path: the train split has {shards} shard(s), fewer than the {world_size} "
                            "processes that would each read their own; prepare again with a smaller "
                            "--shard-samples", public=True)
        return int(np.sort(self.sizes)[: shards // world_size].sum())

    def rank_shards(self, seed: int, epoch: int, rank: int, world_size: int) -> list[int]:
        order = torch.randperm(len(self.sizes), generator=generator_for("shards", seed, epoch)).tolist()
        return order[rank::world_size]

    def stream(self, seed: int, epoch: int, rank: int, world_size: int, start: int = 0) -> Iterator[int]:
        """Rank `rank`'s train indices for `epoch`, from its `start`-th sample on (past the end: its extra shards)."""
        for k in self.rank_shards(seed, epoch, rank, world_size):
            n = int(self.sizes[k])
            if start >= n:
                start -= n
                continue
            within = torch.randperm(n, generator=generator_for("in_shard", seed, epoch, k))[start:]
            yield from (within + int(self.starts[k])).tolist()
            start = 0


class ShardBatchSampler(PositionBatchSampler):
    """`PositionBatchSampler` for sharded data: each rank takes its micro-batches from its own shards, in the
    order `ShardOrder` defines. A position (`set_position`) counts samples of all ranks together, as there."""

    def __init__(self, order: ShardOrder, *, seed: int, micro_batch_size: int, global_batch_size: int,
                 rank: int = 0, world_size: int = 1) -> None:
        self.order = order
        super().__init__(order.rank_samples(world_size) * world_size, seed=seed, micro_batch_size=micro_batch_size,
                         global_batch_size=global_batch_size, rank=rank, world_size=world_size)

    def __iter__(self) -> Iterator[list[Key]]:
        epoch, micro = self.epoch, self.micro_batch_size
        stream = self.order.stream(self.seed, epoch, self.rank, self.world_size, self.start_sample // self.world_size)
        for _ in range(len(self)):
            yield [(epoch, next(stream)) for _ in range(micro)]


def epoch_samples(dataset: Dataset, world_size: int) -> int:
    """Train samples one epoch reads over all ranks: the split (a permutation of it is dealt out), or for sharded
    data what `ShardOrder` deals out on `world_size` ranks."""
    order: Optional[ShardOrder] = getattr(dataset, "order", None)
    return len(dataset) if order is None else order.rank_samples(world_size) * world_size  # type: ignore[arg-type]


def ignore_stop_signals(worker_id: int) -> None:
    """A data worker's init: SIGTERM and SIGINT are the trainer's to act on. They often reach the whole process
    group (torchrun and Slurm preempting, the job server cancelling, Ctrl-C in a terminal); a worker they
    killed would crash the trainer ("DataLoader worker exited unexpectedly") instead of letting it finish the
    step and checkpoint. The trainer still ends its workers, and a worker is SIGKILLed when the trainer dies
    (trainforge.processes: torch's own check of the parent never runs in a worker blocked on a full pipe)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


def make_train_loader(
    dataset: Dataset, sampler: PositionBatchSampler, *, num_workers: int, pin_memory: bool,
    collate: Optional[Callable[[list], Any]] = None,
) -> DataLoader:
    """Micro-batches in the sampler's order, each the task's `collate` of its samples (None: torch's default, a
    pair `(x, y)` of stacked tensors); workers persist across epochs (the sampler lives in the main process, so
    `set_position` between epochs still takes effect)."""
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals,
        generator=_private_generator(),
    )


def _private_generator() -> torch.Generator:
    """Each `iter(loader)` draws a worker base seed; without its own generator it would draw from the
    global torch RNG, so a resumed run (one extra `iter`) would see different dropout masks."""
    return torch.Generator()


def make_eval_loader(dataset: Dataset, *, batch_size: int, num_workers: int, pin_memory: bool,
                     collate: Optional[Callable[[list], Any]] = None) -> DataLoader:
    """All of `dataset` in index order, the last batch possibly smaller; `collate` as for make_train_loader."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        collate_fn=collate,
        shuffle=False,
        drop_last=False,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals,
        generator=_private_generator(),
    )


def resolve_num_workers(spec: Union[int, str], device_type: str) -> int:
    """`data.num_workers`: an int is used as is; "auto" is 0 on CPU (workers would compete with the
    compute threads of a small box), else min(8, cpus // 2)."""
    if isinstance(spec, int):
        return spec
    if spec != "auto":
        raise UserError(f"data.num_workers: expected an integer or 'auto', got {spec!r}")
    if device_type == "cpu":
        return 0
    return min(8, available_cpus() // 2)


class TrainBatches:
    """The train split as an iterator of micro-batches starting at any (epoch, position): the order is a
    function of (seed, epoch), so starting there again — after a resume or an out-of-memory retry with a
    smaller micro-batch — yields the same samples.

        batches = TrainBatches(data.train, seed=0, micro_batch_size=32, global_batch_size=64, num_workers=0,
                               pin_memory=False)
        it = batches.at(epoch=2, position=5)          # the 6th optimizer step of epoch 2
        it = batches.at(epoch=2, position=5, micro_batch_size=16)   # the same samples, smaller pieces
    """

    def __init__(self, dataset: Dataset, *, seed: int, micro_batch_size: int, global_batch_size: int,
                 num_workers: int, pin_memory: bool, rank: int = 0, world_size: int = 1,
                 collate: Optional[Callable[[list], Any]] = None) -> None:
        self.global_batch_size = global_batch_size
        order: Optional[ShardOrder] = getattr(dataset, "order", None)
        geometry = dict(seed=seed, micro_batch_size=micro_batch_size, global_batch_size=global_batch_size, rank=rank,
                        world_size=world_size)
        self.sampler = (PositionBatchSampler(len(dataset), **geometry) if order is None  # type: ignore[arg-type]
                        else ShardBatchSampler(order, **geometry))  # type: ignore[arg-type]
        self.loader = make_train_loader(dataset, self.sampler, num_workers=num_workers, pin_memory=pin_memory,
                                        collate=collate)

    def at(self, epoch: int, position: int, micro_batch_size: Optional[int] = None) -> Iterator:
        if micro_batch_size is not None:
            self.sampler.set_micro_batch_size(micro_batch_size)
        self.sampler.set_position(epoch, position * self.global_batch_size)
        return iter(self.loader)
