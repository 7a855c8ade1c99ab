"""Peak memory as a function of the micro-batch, from two simulations; the largest micro-batch that fits.

The peak of a training step is a fixed part (weights, gradients, optimizer state, workspaces) plus a
part that grows linearly with the micro-batch (activations, logits, temporaries):
peak(b) = fixed + b x per_sample. Two simulations (b = 1 and b = 2) give both terms, so one pair of
simulations prices every GPU of the catalog; the chosen micro-batch is then confirmed by a third
simulation at that size when `verify` is asked for (training's `micro_batch_size: auto` does).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from trainforge.planning.simulate import Simulation

SAFETY_MARGIN = 0.9  # plan to use at most 90% of a device's memory


@dataclass(frozen=True)
class SimKey:
    strategy: str  # none | ddp | fsdp
    world_size: int  # matters for fsdp only (sharding); 1 otherwise
    activation_checkpointing: bool
    precision: str  # memory class: fp32 | bf16 (fp16 behaves like bf16)


@dataclass
class SimCache:
    """Runs each distinct simulation once; `simulate(key, micro_batch_size)` is the expensive call."""

    simulate: Callable[[SimKey, int], Simulation]
    runs: dict[tuple[SimKey, int], Simulation] = field(default_factory=dict)

    def get(self, key: SimKey, micro_batch_size: int) -> Simulation:
        if (key, micro_batch_size) not in self.runs:
            self.runs[(key, micro_batch_size)] = self.simulate(key, micro_batch_size)
        return self.runs[(key, micro_batch_size)]


@dataclass(frozen=True)
class LinearPeak:
    fixed_bytes: float
    per_sample_bytes: float

    def at(self, micro_batch_size: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * micro_batch_size


def fit_linear(one: Simulation, two: Simulation) -> LinearPeak:
    per_sample = max(two.peak_bytes - one.peak_bytes, 0) / (two.micro_batch_size - one.micro_batch_size)
    return LinearPeak(one.peak_bytes - per_sample * one.micro_batch_size, per_sample)


def memory_class(precision: str) -> str:
    """The simulation a precision needs: fp32, or bf16 for both 16-bit formats (same bytes per value)."""
    return "fp32" if precision == "fp32" else "bf16"


def sim_key(strategy: str, world_size: int, activation_checkpointing: bool, precision: str) -> SimKey:
    """The simulation that gives one device's peak under `strategy`: FSDP shards over the world size; a DDP
    replica or a single process holds the whole model."""
    sharded = strategy == "fsdp" and world_size > 1
    return SimKey("fsdp" if sharded else "none", world_size if sharded else 1, activation_checkpointing,
                  memory_class(precision))


def candidate_micro_batches(per_gpu_batch: int) -> list[int]:
    """Micro-batches that divide the per-GPU batch, largest first (accumulation makes up the rest)."""
    return sorted((b for b in range(1, per_gpu_batch + 1) if per_gpu_batch % b == 0), reverse=True)


def largest_fitting(
    per_gpu_batch: int,
    usable_bytes: float,
    predicted: Callable[[int], float],
    confirmed: Optional[Callable[[int], float]] = None,
    limit: Optional[int] = None,
) -> Optional[int]:
    """The largest micro-batch dividing `per_gpu_batch` (and at most `limit`) whose need fits `usable_bytes`;
    None if not even 1 does. THE one search for "the largest micro-batch that fits", used by the planner's
    candidates, `micro_batch_size: auto` and the job admission.

    `predicted(b)` is the cheap estimate (the linear model, corrected) that rules sizes out; `confirmed(b)`, when
    given, is the expensive one (a simulation at b, corrected) that must agree before a size is taken.
    """
    for b in candidate_micro_batches(per_gpu_batch):
        if limit is not None and b > limit:
            continue
        if predicted(b) > usable_bytes:
            continue
        if confirmed is None or confirmed(b) <= usable_bytes:
            return b
    return None
