"""The pure scheduler: priority then submission order, spread and pack placement, sharing, no overcommit."""
from __future__ import annotations

import random

import pytest

from trainforge.errors import UserError
from trainforge.jobs.scheduler import (PLACEMENTS, Pending, Placed, assign, best_fit, check_placement, free_memory,
                                       never_fits, queue_order, spread)

MiB = 2**20
GiB = 2**30


def test_queue_order_is_priority_then_submission():
    jobs = [Pending(1, 0, 1, MiB), Pending(2, 5, 1, MiB), Pending(3, 0, 1, MiB), Pending(4, 5, 1, MiB), Pending(5, -1, 1, MiB)]
    assert [j.seq for j in queue_order(jobs)] == [2, 4, 1, 3, 5]


def test_assign_starts_in_priority_then_fifo_order():
    capacity = {"0": 10 * MiB}
    jobs = [Pending(1, 0, 1, 4 * MiB), Pending(2, 0, 1, 4 * MiB), Pending(3, 9, 1, 4 * MiB)]
    # room for two: the high-priority job and then the older of the two others
    for placement in PLACEMENTS:
        assert assign(jobs, capacity, [], placement) == [(3, ["0"]), (1, ["0"])]


def test_best_fit_picks_the_tightest_slot_that_holds_the_job():
    free = {"0": 10 * MiB, "1": 3 * MiB, "2": 5 * MiB}
    assert best_fit(free, 4 * MiB, 1) == ["2"]
    assert best_fit(free, 3 * MiB, 1) == ["1"]
    assert best_fit(free, 11 * MiB, 1) is None


def test_small_jobs_share_a_gpu_and_leave_the_big_hole_open():
    capacity = {"0": 16 * MiB, "1": 16 * MiB}
    running = [Placed(("0",), 10 * MiB)]  # slot 0 has 6 MiB left
    jobs = [Pending(1, 0, 1, 3 * MiB), Pending(2, 0, 1, 3 * MiB), Pending(3, 0, 1, 16 * MiB)]
    # pack: both small jobs go on the busy GPU (best fit), so the 16 MiB job still finds an empty one
    assert assign(jobs, capacity, running, "pack") == [(1, ["0"]), (2, ["0"]), (3, ["1"])]
    # spread: the small jobs take the idle GPU, and the 16 MiB job waits for it to drain
    assert assign(jobs, capacity, running, "spread") == [(1, ["1"]), (2, ["1"])]


def test_multi_gpu_job_needs_that_many_slots_each_with_room():
    capacity = {"0": 8 * MiB, "1": 8 * MiB, "2": 8 * MiB}
    running = [Placed(("1",), 6 * MiB)]
    for placement in PLACEMENTS:
        assert assign([Pending(1, 0, 2, 4 * MiB)], capacity, running, placement) == [(1, ["0", "2"])]
        assert assign([Pending(1, 0, 3, 4 * MiB)], capacity, running, placement) == []  # slot 1 lacks room: wait


def test_the_queue_head_blocks_what_is_behind_it():
    capacity = {"0": 8 * MiB}
    running = [Placed(("0",), 6 * MiB)]
    # the first job does not fit now; the small one behind it must not jump the queue
    for placement in PLACEMENTS:
        assert assign([Pending(1, 0, 1, 4 * MiB), Pending(2, 0, 1, 1 * MiB)], capacity, running, placement) == []


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_random_workloads_never_overcommit_a_slot(placement):
    rng = random.Random(0)
    for _ in range(300):
        capacity = {str(i): rng.choice([4, 8, 16]) * MiB for i in range(rng.randint(1, 4))}
        running: list[Placed] = []
        jobs = [Pending(i, rng.randint(0, 2), rng.randint(1, 2), rng.randint(1, 9) * MiB) for i in range(12)]
        starts = assign(jobs, capacity, running, placement)
        need = {j.seq: j for j in jobs}
        placed = [Placed(tuple(slots), need[seq].memory_bytes) for seq, slots in starts]
        assert all(free >= 0 for free in free_memory(capacity, placed).values())
        for seq, slots in starts:
            assert len(slots) == len(set(slots)) == need[seq].num_gpus
        started = [seq for seq, _ in starts]
        assert started == [j.seq for j in queue_order(jobs)][: len(started)]  # a prefix of the queue order


def test_never_fits_explains_why():
    capacity = {"0": 8 * MiB, "1": 4 * MiB}
    assert never_fits(capacity, 8 * MiB, 1) is None
    assert "largest slot" in never_fits(capacity, 9 * MiB, 1)
    assert never_fits(capacity, 4 * MiB, 2) is None
    assert "2 largest slots" in never_fits(capacity, 5 * MiB, 2)
    assert "asks for 3 GPUs" in never_fits(capacity, MiB, 3)


# ---------------------------------------------------------------- spread (the default) vs pack


def test_the_issues_example_spreads_over_both_gpus_by_default():
    """Jobs of 10, 30 and 30 GiB on two 40 GiB GPUs: spread balances them; pack fills GPU 0 first."""
    capacity = {"0": 40 * GiB, "1": 40 * GiB}
    jobs = [Pending(1, 0, 1, 10 * GiB), Pending(2, 0, 1, 30 * GiB), Pending(3, 0, 1, 30 * GiB)]
    # spread: 10 -> GPU 0 (tie: the first slot), 30 -> the idle GPU 1, 30 -> GPU 0 (30 free vs GPU 1's 10)
    assert assign(jobs, capacity, []) == assign(jobs, capacity, [], "spread") == [(1, ["0"]), (2, ["1"]), (3, ["0"])]
    assert assign(jobs, capacity, [], "pack") == [(1, ["0"]), (2, ["0"]), (3, ["1"])]  # best fit, as before


def test_the_issues_two_80_gib_gpus_pack_leaves_gpu_1_idle_and_spread_does_not():
    capacity = {"0": 80 * GiB, "1": 80 * GiB}
    jobs = [Pending(1, 0, 1, 10 * GiB), Pending(2, 0, 1, 30 * GiB), Pending(3, 0, 1, 30 * GiB)]
    assert assign(jobs, capacity, [], "pack") == [(1, ["0"]), (2, ["0"]), (3, ["0"])]  # the reported behaviour
    # spread: 10 -> 0 (tie), 30 -> 1 (80 free vs 70), 30 -> 0 (70 free vs 50)
    assert assign(jobs, capacity, [], "spread") == [(1, ["0"]), (2, ["1"]), (3, ["0"])]


def test_spread_picks_the_slot_with_the_most_free_memory_that_holds_the_job():
    free = {"0": 10 * MiB, "1": 3 * MiB, "2": 5 * MiB}
    assert spread(free, 4 * MiB, 1) == ["0"]
    assert spread(free, 4 * MiB, 2) == ["0", "2"]  # the two roomiest, returned in slot order
    assert spread(free, 6 * MiB, 2) is None  # only one slot holds 6 MiB
    assert spread(free, 11 * MiB, 1) is None


def test_least_loaded_means_most_free_memory_not_fewest_jobs():
    capacity = {"0": 40 * GiB, "1": 40 * GiB}
    running = [Placed(("0",), 1 * GiB), Placed(("0",), 1 * GiB), Placed(("1",), 30 * GiB)]
    # GPU 0 runs two jobs but has 38 GiB free; GPU 1 runs one and has 10 GiB free
    assert assign([Pending(4, 0, 1, 5 * GiB)], capacity, running, "spread") == [(4, ["0"])]
    assert assign([Pending(4, 0, 1, 5 * GiB)], capacity, running, "pack") == [(4, ["1"])]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_ties_go_to_the_slot_listed_first(placement):
    capacity = {"b": 8 * MiB, "a": 8 * MiB, "c": 8 * MiB}  # slot order, not name order
    assert assign([Pending(1, 0, 1, MiB)], capacity, [], placement) == [(1, ["b"])]
    assert assign([Pending(1, 0, 2, MiB)], capacity, [], placement) == [(1, ["b", "a"])]
    # the same input always gives the same answer
    jobs = [Pending(i, 0, 1 + i % 2, MiB) for i in range(6)]
    assert assign(jobs, capacity, [], placement) == assign(list(reversed(jobs)), dict(capacity), [], placement)


def test_spread_places_a_multi_gpu_job_on_the_least_loaded_slots():
    capacity = {"0": 40 * GiB, "1": 40 * GiB, "2": 40 * GiB, "3": 40 * GiB}
    running = [Placed(("0",), 20 * GiB), Placed(("2",), 5 * GiB)]  # free: 20, 40, 35, 40
    job = [Pending(1, 0, 2, 10 * GiB)]
    assert assign(job, capacity, running, "spread") == [(1, ["1", "3"])]  # the two idle GPUs
    assert assign(job, capacity, running, "pack") == [(1, ["0", "2"])]  # the two fullest that hold it
    # three GPUs: spread adds the next roomiest (2: 35 free), pack the next fullest (2: 35 free, before 1 and 3)
    job3 = [Pending(1, 0, 3, 10 * GiB)]
    assert assign(job3, capacity, running, "spread") == [(1, ["1", "2", "3"])]
    assert assign(job3, capacity, running, "pack") == [(1, ["0", "1", "2"])]
    # a slot without room is skipped by both, and too few roomy slots means wait
    assert assign([Pending(1, 0, 3, 25 * GiB)], capacity, running, "spread") == [(1, ["1", "2", "3"])]
    assert assign([Pending(1, 0, 4, 25 * GiB)], capacity, running, "spread") == []


def test_check_placement_names_the_choices():
    assert PLACEMENTS == ("spread", "pack")  # spread is the default
    assert [check_placement(p) for p in PLACEMENTS] == list(PLACEMENTS)
    with pytest.raises(UserError) as e:
        check_placement("balance")
    assert str(e.value) == "--placement: expected spread or pack, got 'balance'"
