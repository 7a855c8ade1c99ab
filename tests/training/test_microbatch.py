from __future__ import annotations

import pytest

from trainforge.errors import JobFailed, UserError
from trainforge.training.microbatch import accumulation_steps, halve_micro_batch


def test_accumulation_keeps_global_batch():
    assert accumulation_steps(64, 16) == 4
    assert accumulation_steps(64, 8, world_size=2) == 4
    with pytest.raises(UserError, match="train.global_batch_size"):
        accumulation_steps(64, 12)


def test_halving_keeps_the_product_and_stops_at_odd():
    assert halve_micro_batch(32, 1) == (16, 2)
    assert halve_micro_batch(2, 16) == (1, 32)
    with pytest.raises(JobFailed, match="cannot be halved"):
        halve_micro_batch(3, 1)


def test_fitting_micro_batch_for_another_world_size():
    from trainforge.training.microbatch import fitting_micro_batch

    assert fitting_micro_batch(16, 32, 1) == 16
    assert fitting_micro_batch(16, 32, 4) == 8  # 8 per rank
    assert fitting_micro_batch(16, 48, 2) == 12
    assert fitting_micro_batch(5, 32, 2) == 4
