"""Which queued jobs start now, and on which slots: pure functions over plain numbers.

    order = queue_order(queued)                            # priority (higher first), then submission order
    free = free_memory(capacity_bytes, running)            # slot id -> bytes not reserved by running jobs
    starts = assign(queued, capacity_bytes, running)       # [(job id, [slot ids])], in start order

Every job reserves `memory_bytes` on each of its `num_gpus` slots (the planner's predicted peak per
device). Packing is best-fit: a job goes to the slots with the least free memory that still hold it, so
small jobs share a GPU and large holes stay open for large jobs. The queue is strict: the first job that
does not fit now waits for room and nothing behind it starts (no backfill), so a job asking for 4 GPUs is
never starved by a stream of 1-GPU jobs and jobs start in exactly priority-then-submission order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

GiB = 2**30


@dataclass(frozen=True)
class Pending:
    """A queued job as the scheduler sees it; `seq` is the submission order (the job id)."""

    seq: int
    priority: int
    num_gpus: int
    memory_bytes: int


@dataclass(frozen=True)
class Placed:
    """A running job's reservation: `memory_bytes` on each slot in `slots`."""

    slots: tuple[str, ...]
    memory_bytes: int


def queue_order(queued: Sequence[Pending]) -> list[Pending]:
    """Higher priority first; equal priorities in submission order."""
    return sorted(queued, key=lambda j: (-j.priority, j.seq))


def free_memory(capacity_bytes: Mapping[str, int], running: Sequence[Placed]) -> dict[str, int]:
    """Bytes of each slot not reserved by a running job (negative never happens when `assign` placed them)."""
    free = dict(capacity_bytes)
    for placed in running:
        for slot in placed.slots:
            if slot in free:
                free[slot] -= placed.memory_bytes
    return free


def best_fit(free_bytes: Mapping[str, int], need_bytes: int, count: int) -> Optional[list[str]]:
    """The `count` distinct slots with the least free memory that still hold `need_bytes`; None if too few.
    Ties go to the slot listed first, so placement is deterministic."""
    order = {slot: i for i, slot in enumerate(free_bytes)}
    roomy = sorted((s for s, free in free_bytes.items() if free >= need_bytes), key=lambda s: (free_bytes[s], order[s]))
    if len(roomy) < count:
        return None
    return sorted(roomy[:count], key=order.__getitem__)


def assign(
    queued: Sequence[Pending], capacity_bytes: Mapping[str, int], running: Sequence[Placed]
) -> list[tuple[int, list[str]]]:
    """Jobs to start now, in order, with their slots; stops at the first job that does not fit."""
    free = free_memory(capacity_bytes, running)
    starts: list[tuple[int, list[str]]] = []
    for job in queue_order(queued):
        slots = best_fit(free, job.memory_bytes, job.num_gpus)
        if slots is None:
            break
        for slot in slots:
            free[slot] -= job.memory_bytes
        starts.append((job.seq, slots))
    return starts


def size(num_bytes: float) -> str:
    return f"{num_bytes / GiB:.2f} GiB" if num_bytes >= GiB else f"{num_bytes / 2**20:.1f} MiB"


def never_fits(capacity_bytes: Mapping[str, int], need_bytes: int, count: int) -> Optional[str]:
    """Why a job can never run on these slots, even with all of them empty; None when it can."""
    if count > len(capacity_bytes):
        return f"asks for {count} GPUs; this server has {len(capacity_bytes)} slot(s); pass --gpus {len(capacity_bytes)} or fewer"
    if best_fit(capacity_bytes, need_bytes, count) is None:
        largest = sorted(capacity_bytes.values(), reverse=True)[count - 1]
        where = "per GPU " if count > 1 else ""
        return (f"needs {size(need_bytes)} {where}(planner's predicted peak) but the "
                f"{'largest slot holds' if count == 1 else f'{count} largest slots hold'} {size(largest)}; "
                "lower train.micro_batch_size or use a smaller model")
    return None
