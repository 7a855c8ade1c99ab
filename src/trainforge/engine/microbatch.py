"""Batch geometry: global = micro x accumulation x world size, and the OOM fallback that keeps it.

`train.micro_batch_size` is an upper bound: the run uses the largest micro-batch <= it that divides each
rank's share of the global batch, so the default recipe runs unchanged on 1, 2, 4 or 8 processes.

    geometry = batch_geometry(64, 64, world_size=3)   # UserError: 64 samples do not split over 3 ranks
    geometry = batch_geometry(64, 24, world_size=2)   # Geometry(micro=16, accumulation=2, note="...")
    micro = shrink_micro_batch(15, per_rank=15)          # after an OOM: 5 (accumulation 3), same samples per step
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trainforge.errors import JobFailed, UserError
from trainforge.files import write_text_atomic
from trainforge.layout import OOM_RESTART


@dataclass(frozen=True)
class Geometry:
    micro_batch_size: int
    accumulation: int
    note: Optional[str] = None  # set when the micro-batch differs from the one asked for: say it once


def per_rank_batch(global_batch_size: int, world_size: int) -> int:
    """Each rank's share of the global batch; UserError (before anything starts) when there is no equal share."""
    if global_batch_size < world_size:
        raise UserError(
            f"train.global_batch_size ({global_batch_size}) is smaller than the world size ({world_size} processes): "
            f"every process needs at least one sample per step; set train.global_batch_size to {world_size} or more"
        )
    if global_batch_size % world_size:
        lower = global_batch_size - global_batch_size % world_size
        raise UserError(
            f"train.global_batch_size ({global_batch_size}) does not split evenly over {world_size} processes; "
            f"set it to a multiple of {world_size}, e.g. {lower} or {lower + world_size}"
        )
    return global_batch_size // world_size


def largest_divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of `n` that is <= `limit` (1 when limit < 1)."""
    return max((d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0), default=1)


def batch_geometry(global_batch_size: int, micro_batch_size: int, world_size: int = 1) -> Geometry:
    """The micro-batch and accumulation that run `global_batch_size` samples per optimizer step on `world_size`
    processes, with a micro-batch of at most `micro_batch_size`."""
    per_rank = per_rank_batch(global_batch_size, world_size)
    micro = largest_divisor_at_most(per_rank, micro_batch_size)
    note = None
    if micro != micro_batch_size:
        note = (f"train.micro_batch_size {micro_batch_size} -> {micro}: the largest that divides each process's "
                f"{per_rank} samples per step ({global_batch_size} over {world_size} process"
                f"{'es' if world_size > 1 else ''}), accumulation {per_rank // micro}")
    return Geometry(micro, per_rank // micro, note)


def shrink_micro_batch(micro_batch_size: int, per_rank: int) -> int:
    """After an out-of-memory error: the largest divisor of this rank's share of the global batch that is at
    most half the micro-batch, so the samples per step stay the same (15 -> 5 of 15, 16 -> 8, 7 -> 1 of 7).

    Raises JobFailed (exit 1) when the micro-batch is already 1.
    """
    if micro_batch_size <= 1:
        raise JobFailed(
            "out of memory at micro-batch 1, which cannot shrink further; "
            "use a smaller model, train.precision=bf16, activation checkpointing, or a larger device"
        )
    return largest_divisor_at_most(per_rank, micro_batch_size // 2)


OOM_RESTART_FILE = OOM_RESTART


def request_oom_restart(run_dir: Path, micro_batch_size: int, step: int, strategy: str) -> None:
    """When the ranks cannot agree in place (an out-of-memory error under FSDP, whose forward has collectives,
    or in DDP's communicating backward), record the micro-batch that failed and fail: torchrun restarts the
    whole group (`--max-restarts`), which resumes from the last checkpoint with a smaller micro-batch
    (`training.setup.resolve` shrinks it). A rank blocked in a collective is ended by torchrun, never left hanging."""
    write_text_atomic(run_dir / OOM_RESTART_FILE, json.dumps({"failed_micro_batch_size": micro_batch_size, "step": step}))
    raise JobFailed(
        f"out of memory at step {step} under {strategy} with micro-batch {micro_batch_size}: the worker group must "
        f"restart with a smaller one (torchrun does so with --max-restarts >= 1)"
    )


def read_oom_restart(run_dir: Path) -> Optional[tuple[int, int]]:
    """(micro-batch that failed, step) of a restart request, or None."""
    try:
        note = json.loads((run_dir / OOM_RESTART_FILE).read_text())
        return int(note["failed_micro_batch_size"]), int(note["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def clear_oom_restart(run_dir: Path) -> None:
    """The request is consumed once read: a later resume is not held to it (its checkpoints record the size)."""
    (run_dir / OOM_RESTART_FILE).unlink(missing_ok=True)
