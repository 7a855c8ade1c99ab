"""Which queued jobs start now, and on which slots: pure functions over plain numbers.

    order = queue_order(queued)                            # priority (higher first), then submission order
    free = free_memory(capacity_bytes, running)            # slot id -> bytes not reserved by running jobs
    starts = assign(queued, capacity_bytes, running, placement="spread")   # [(job id, [slot ids])], in start order

Every job reserves `memory_bytes` on each of its `num_gpus` slots (the planner's predicted peak per
device). Two placements (`trainforge server --placement`):
- `spread` (the default): a job goes to the slots with the MOST free memory that hold it, i.e. the least
  loaded GPUs by reserved memory (not by number of jobs: one 30 GiB job loads a GPU more than two 1 GiB
  ones), so jobs get a GPU to themselves while there are idle GPUs.
- `pack`: best fit, the slots with the LEAST free memory that still hold it, so small jobs share a GPU and
  large holes stay open for large jobs (and idle GPUs stay idle).
Ties go to the slot listed first in both, so placement is deterministic. The queue is strict: the first job that
does not fit now waits for room and nothing behind it starts (no backfill), so a job asking for 4 GPUs is
never starved by a stream of 1-GPU jobs and jobs start in exactly priority-then-submission order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from trainforge.errors import UserError

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


def _choose(free_bytes: Mapping[str, int], need_bytes: int, count: int, sign: int) -> Optional[list[str]]:
    """The `count` distinct slots that hold `need_bytes`, fewest free bytes first (sign 1) or most (sign -1);
    ties to the slot listed first; returned in slot order. None if too few slots have room."""
    order = {slot: i for i, slot in enumerate(free_bytes)}
    roomy = sorted((s for s, free in free_bytes.items() if free >= need_bytes),
                   key=lambda s: (sign * free_bytes[s], order[s]))
    if len(roomy) < count:
        return None
    return sorted(roomy[:count], key=order.__getitem__)


def best_fit(free_bytes: Mapping[str, int], need_bytes: int, count: int) -> Optional[list[str]]:
    """`pack`: the `count` distinct slots with the least free memory that still hold `need_bytes`; None if too few."""
    return _choose(free_bytes, need_bytes, count, 1)


def spread(free_bytes: Mapping[str, int], need_bytes: int, count: int) -> Optional[list[str]]:
    """`spread`: the `count` distinct slots with the most free memory (the least loaded) that hold `need_bytes`;
    None if too few."""
    return _choose(free_bytes, need_bytes, count, -1)


PLACERS = {"spread": spread, "pack": best_fit}
PLACEMENTS = tuple(PLACERS)  # `trainforge server --placement` choices; the first is the default


def check_placement(placement: str) -> str:
    """`placement` if it names one; else a UserError listing the choices."""
    if placement not in PLACERS:
        raise UserError(f"--placement: expected {' or '.join(PLACEMENTS)}, got {placement!r}")
    return placement


def assign(
    queued: Sequence[Pending], capacity_bytes: Mapping[str, int], running: Sequence[Placed],
    placement: str = PLACEMENTS[0],
) -> list[tuple[int, list[str]]]:
    """Jobs to start now, in order, with their slots; stops at the first job that does not fit."""
    choose = PLACERS[placement]
    free = free_memory(capacity_bytes, running)
    starts: list[tuple[int, list[str]]] = []
    for job in queue_order(queued):
        slots = choose(free, job.memory_bytes, job.num_gpus)
        if slots is None:
            break
        for slot in slots:
            free[slot] -= job.memory_bytes
        starts.append((job.seq, slots))
    return starts


def size(num_bytes: float) -> str:
    return f"{num_bytes / GiB:.2f} GiB" if num_bytes >= GiB else f"{num_bytes / 2**20:.1f} MiB"


def never_fits(capacity_bytes: Mapping[str, int], need_bytes: int, count: int,
               what: str = "(planner's predicted peak)",
               fix: str = "lower train.micro_batch_size or use a smaller model") -> Optional[str]:
    """Why a job can never run on these slots, even with all of them empty; None when it can. `what` says where
    `need_bytes` comes from, `fix` what to change."""
    if count > len(capacity_bytes):
        return f"asks for {count} GPUs; this server has {len(capacity_bytes)} slot(s); pass --gpus {len(capacity_bytes)} or fewer"
    if best_fit(capacity_bytes, need_bytes, count) is None:
        largest = sorted(capacity_bytes.values(), reverse=True)[count - 1]
        where = "per GPU " if count > 1 else ""
        return (f"needs {size(need_bytes)} {where}{what} but the "
                f"{'largest slot holds' if count == 1 else f'{count} largest slots hold'} {size(largest)}; "
                f"{fix}")
    return None
