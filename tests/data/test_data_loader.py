"""Loader: order is a function of (seed, epoch); resume, workers and ranks see the same samples."""
from __future__ import annotations

import pytest
import torch

from data_helpers import data_cfg
from trainforge.data import build_data
from trainforge.data.stages.loader import (
    PositionBatchSampler,
    epoch_order,
    make_eval_loader,
    make_train_loader,
    resolve_num_workers,
    steps_per_epoch,
)
from trainforge.errors import UserError


def keys(sampler):
    return [key for batch in sampler for key in batch]


def test_order_uses_the_first_steps_times_global_samples_of_the_permutation():
    s = PositionBatchSampler(103, seed=1, micro_batch_size=4, global_batch_size=16)
    assert s.steps_per_epoch == 6 and len(s) == 24
    s.set_position(3)
    got = keys(s)
    assert got == [(3, int(i)) for i in epoch_order(103, 1, 3)[:96]]
    assert len(set(got)) == 96
    assert epoch_order(103, 1, 3).tolist() != epoch_order(103, 1, 4).tolist()


def test_iterating_does_not_advance_the_epoch():
    s = PositionBatchSampler(32, seed=0, micro_batch_size=8, global_batch_size=8)
    assert keys(s) == keys(s)


def test_resume_yields_exactly_the_tail_of_the_uninterrupted_order():
    s = PositionBatchSampler(200, seed=5, micro_batch_size=4, global_batch_size=16)
    s.set_position(2)
    full = list(s)
    s.set_position(2, start_sample=48)
    assert list(s) == full[12:] and len(s) == len(full) - 12


def test_halving_the_micro_batch_keeps_the_order():
    s = PositionBatchSampler(200, seed=5, micro_batch_size=8, global_batch_size=16)
    s.set_position(0)
    full = keys(s)
    s.set_micro_batch_size(4)
    s.set_position(0, start_sample=32)
    batches = list(s)
    assert all(len(b) == 4 for b in batches)
    assert [k for b in batches for k in b] == full[32:]
    with pytest.raises(UserError, match="train.micro_batch_size: 3"):
        s.set_micro_batch_size(3)
    with pytest.raises(ValueError, match="multiple of 4"):
        s.set_position(0, start_sample=6)


def test_ranks_together_cover_what_one_rank_covers_per_step():
    single = PositionBatchSampler(100, seed=9, micro_batch_size=8, global_batch_size=16, world_size=1)
    ranks = [PositionBatchSampler(100, seed=9, micro_batch_size=4, global_batch_size=16, rank=r, world_size=2) for r in (0, 1)]
    for s in (single, *ranks):
        s.set_position(1, start_sample=16)
    one = list(single)
    two = [list(r) for r in ranks]
    assert len(one) == len(two[0]) == len(two[1]) == 10  # (96 - 16) / 8 per micro-step
    for step, batch in enumerate(one):
        assert two[0][step] + two[1][step] == batch  # rank r: its contiguous slice of the micro-step
    assert set(keys(ranks[0])).isdisjoint(keys(ranks[1]))


def test_steps_per_epoch_errors_name_the_field():
    assert steps_per_epoch(130, 64) == 2
    with pytest.raises(UserError, match=r"train.global_batch_size: 64 is larger than the training split \(40 samples\)"):
        steps_per_epoch(40, 64)


@pytest.fixture(scope="module")
def augmented_bundle():
    cfg = data_cfg(
        "synthetic_images",
        args={"num_samples": 96, "image_size": 8, "channels": 3, "num_classes": 4},
        augment={"rotation_deg": 20, "crop_scale": [0.6, 1.0], "hflip": 0.5, "color_jitter": 0.3},
    )
    return build_data(cfg, seed=3)


def collect(bundle, *, num_workers, epoch, start_sample=0):
    sampler = PositionBatchSampler(len(bundle.train), seed=3, micro_batch_size=8, global_batch_size=16)
    loader = make_train_loader(bundle.train, sampler, num_workers=num_workers, pin_memory=False)
    out = []
    for e in (epoch, epoch + 1):  # persistent workers see the new position of the second epoch
        sampler.set_position(e, start_sample if e == epoch else 0)
        out += list(loader)
    return out


def test_workers_give_bit_identical_batches(augmented_bundle):
    serial = collect(augmented_bundle, num_workers=0, epoch=4)
    parallel = collect(augmented_bundle, num_workers=2, epoch=4)
    assert len(serial) == len(parallel) == 12  # 63 train samples: 3 steps of 16 = 6 micro-batches per epoch
    for (xs, ys), (xp, yp) in zip(serial, parallel):
        assert xs.shape == (8, 3, 8, 8) and ys.dtype == torch.int64
        assert torch.equal(xs, xp) and torch.equal(ys, yp)
    resumed = collect(augmented_bundle, num_workers=0, epoch=4, start_sample=32)
    assert len(resumed) == 8
    for (xs, ys), (xr, yr) in zip(serial[4:], resumed):
        assert torch.equal(xs, xr) and torch.equal(ys, yr)


def test_eval_loader_covers_every_sample_in_order(augmented_bundle):
    loader = make_eval_loader(augmented_bundle.val, batch_size=5, num_workers=0, pin_memory=False)
    ys = torch.cat([y for _, y in loader])
    assert ys.tolist() == [int(augmented_bundle.val[i][1]) for i in range(len(augmented_bundle.val))]


def test_resolve_num_workers(monkeypatch):
    import trainforge.data.stages.loader as loader

    assert resolve_num_workers(3, "cuda") == 3
    assert resolve_num_workers("auto", "cpu") == 0
    monkeypatch.setattr(loader, "available_cpus", lambda: 64)
    assert resolve_num_workers("auto", "cuda") == 8
    monkeypatch.setattr(loader, "available_cpus", lambda: 6)
    assert resolve_num_workers("auto", "cuda") == 3
