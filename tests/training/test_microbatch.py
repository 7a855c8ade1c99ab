from __future__ import annotations

import pytest

from trainforge.errors import JobFailed, UserError
from trainforge.engine.microbatch import batch_geometry, per_rank_batch, shrink_micro_batch


@pytest.mark.parametrize("global_batch, micro, world, expected", [
    (64, 64, 1, (64, 1)),
    (64, 64, 2, (32, 1)),   # the default recipe on two processes
    (64, 24, 2, (16, 2)),
    (100, 64, 1, (50, 2)),  # micro is an upper bound, not a divisor the user must find
    (30, 15, 1, (15, 2)),
    (7, 64, 7, (1, 1)),
    (96, 5, 8, (4, 3)),
])
def test_micro_batch_is_the_largest_divisor_of_the_rank_share_at_most_the_request(global_batch, micro, world, expected):
    geometry = batch_geometry(global_batch, micro, world)
    assert (geometry.micro_batch_size, geometry.accumulation) == expected
    assert geometry.micro_batch_size * geometry.accumulation * world == global_batch
    assert (geometry.note is None) == (expected[0] == micro)


def test_the_note_says_what_changed_and_why():
    note = batch_geometry(64, 64, 2).note
    assert note is not None and "64 -> 32" in note and "2 processes" in note


@pytest.mark.parametrize("global_batch, world, match", [
    (2, 4, "smaller than the world size"),
    (10, 4, "does not split evenly over 4 processes; set it to a multiple of 4, e.g. 8 or 12"),
])
def test_impossible_geometry_is_one_user_error(global_batch, world, match):
    with pytest.raises(UserError, match=match):
        per_rank_batch(global_batch, world)
    with pytest.raises(UserError, match=match):
        batch_geometry(global_batch, 1, world)


@pytest.mark.parametrize("micro, accumulation, expected", [
    (32, 1, (16, 2)),
    (2, 16, (1, 32)),
    (15, 1, (5, 3)),    # odd: the largest divisor of 15 that is at most 7
    (15, 2, (6, 5)),    # of the rank's share, 30
    (7, 1, (1, 7)),     # a prime: down to 1
    (3, 4, (1, 12)),
])
def test_oom_shrink_keeps_the_samples_per_step_and_handles_odd_sizes(micro, accumulation, expected):
    new_micro, new_acc = expected
    assert shrink_micro_batch(micro, per_rank=micro * accumulation) == new_micro
    assert new_micro <= micro // 2 and new_micro * new_acc == micro * accumulation


def test_oom_at_micro_batch_one_fails_the_run():
    with pytest.raises(JobFailed, match="cannot shrink further"):
        shrink_micro_batch(1, 8)
