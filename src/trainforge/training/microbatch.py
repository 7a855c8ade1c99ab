"""Batch geometry: global = micro x accumulation x world size, and the OOM fallback that keeps it."""
from __future__ import annotations

from trainforge.errors import JobFailed, UserError


def accumulation_steps(global_batch_size: int, micro_batch_size: int, world_size: int = 1) -> int:
    per_step = micro_batch_size * world_size
    if global_batch_size % per_step:
        raise UserError(
            f"train.global_batch_size ({global_batch_size}) must be a multiple of train.micro_batch_size "
            f"x world size ({micro_batch_size} x {world_size}); change one of them"
        )
    return global_batch_size // per_step


def halve_micro_batch(micro_batch_size: int, accumulation: int) -> tuple[int, int]:
    """After an out-of-memory error: half the micro-batch, twice the accumulation, same global batch.

    Raises JobFailed (exit 1) when the micro-batch cannot shrink further (odd or already 1).
    """
    if micro_batch_size <= 1 or micro_batch_size % 2:
        raise JobFailed(
            f"out of memory at micro-batch {micro_batch_size}, which cannot be halved; "
            "use a smaller model, train.precision=bf16, or a larger device"
        )
    return micro_batch_size // 2, accumulation * 2


def fitting_micro_batch(micro_batch_size: int, global_batch_size: int, world_size: int) -> int:
    """The largest micro-batch <= `micro_batch_size` that divides this world size's share of the global batch."""
    per_rank = global_batch_size // world_size
    return max(m for m in range(1, min(micro_batch_size, per_rank) + 1) if global_batch_size % (m * world_size) == 0)
