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
