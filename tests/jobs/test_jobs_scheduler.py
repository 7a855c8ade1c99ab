"""The pure scheduler: priority then submission order, best-fit packing, sharing, no overcommit."""
from __future__ import annotations

import random

from trainforge.jobs.scheduler import Pending, Placed, assign, best_fit, free_memory, never_fits, queue_order

MiB = 2**20


def test_queue_order_is_priority_then_submission():
    jobs = [Pending(1, 0, 1, MiB), Pending(2, 5, 1, MiB), Pending(3, 0, 1, MiB), Pending(4, 5, 1, MiB), Pending(5, -1, 1, MiB)]
    assert [j.seq for j in queue_order(jobs)] == [2, 4, 1, 3, 5]


def test_assign_starts_in_priority_then_fifo_order():
    capacity = {"0": 10 * MiB}
    jobs = [Pending(1, 0, 1, 4 * MiB), Pending(2, 0, 1, 4 * MiB), Pending(3, 9, 1, 4 * MiB)]
    # room for two: the high-priority job and then the older of the two others
    assert assign(jobs, capacity, []) == [(3, ["0"]), (1, ["0"])]


def test_best_fit_picks_the_tightest_slot_that_holds_the_job():
    free = {"0": 10 * MiB, "1": 3 * MiB, "2": 5 * MiB}
    assert best_fit(free, 4 * MiB, 1) == ["2"]
    assert best_fit(free, 3 * MiB, 1) == ["1"]
    assert best_fit(free, 11 * MiB, 1) is None


def test_small_jobs_share_a_gpu_and_leave_the_big_hole_open():
    capacity = {"0": 16 * MiB, "1": 16 * MiB}
    running = [Placed(("0",), 10 * MiB)]  # slot 0 has 6 MiB left
    jobs = [Pending(1, 0, 1, 3 * MiB), Pending(2, 0, 1, 3 * MiB), Pending(3, 0, 1, 16 * MiB)]
    # both small jobs go on the busy GPU (best fit), so the 16 MiB job still finds an empty one
    assert assign(jobs, capacity, running) == [(1, ["0"]), (2, ["0"]), (3, ["1"])]


def test_multi_gpu_job_needs_that_many_slots_each_with_room():
    capacity = {"0": 8 * MiB, "1": 8 * MiB, "2": 8 * MiB}
    running = [Placed(("1",), 6 * MiB)]
    assert assign([Pending(1, 0, 2, 4 * MiB)], capacity, running) == [(1, ["0", "2"])]
    assert assign([Pending(1, 0, 3, 4 * MiB)], capacity, running) == []  # slot 1 lacks room: wait


def test_the_queue_head_blocks_what_is_behind_it():
    capacity = {"0": 8 * MiB}
    running = [Placed(("0",), 6 * MiB)]
    # the first job does not fit now; the small one behind it must not jump the queue
    assert assign([Pending(1, 0, 1, 4 * MiB), Pending(2, 0, 1, 1 * MiB)], capacity, running) == []


def test_random_workloads_never_overcommit_a_slot():
    rng = random.Random(0)
    for _ in range(300):
        capacity = {str(i): rng.choice([4, 8, 16]) * MiB for i in range(rng.randint(1, 4))}
        running: list[Placed] = []
        jobs = [Pending(i, rng.randint(0, 2), rng.randint(1, 2), rng.randint(1, 9) * MiB) for i in range(12)]
        starts = assign(jobs, capacity, running)
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
