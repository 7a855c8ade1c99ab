"""Peak memory as a function of the micro-batch, from simulations; the largest micro-batch that fits.

At any moment of a training step the memory held is a fixed part (weights, gradients, optimizer state,
workspaces) plus a part that grows linearly with the micro-batch (activations, logits, temporaries). The
peak is the largest over the step, and the moment that holds it can change with the micro-batch: at
micro-batch 1 it is often in backward or the optimizer step (all of the state, few activations), at larger
ones the end of forward. So the peak is a maximum of lines, convex in the micro-batch, not a line: the line
through micro-batch 1 and 2 can fall far below it further on (a 2-layer GPT with a 4096-token vocabulary:
5.3 MB per sample from micro-batch 2 on, 1.7 MB between 1 and 2, so 2.5x under at 32;
tests/planning/test_memory.py). By convexity that line is a lower bound from 2 on: `largest_fitting` uses
it to rule sizes out and confirms the size it takes with a simulation at that size (`confirmed`), so the
answer is the largest micro-batch whose simulated peak fits. The lines are fitted per phase of the step
(`Simulation.phase_peak_bytes`: forward + backward, optimizer step), each a lower bound of its phase, which
makes the bound tighter when the optimizer step holds the peak at micro-batch 1. The simulations are cached
(`SimCache`) and shared by every GPU of the catalog.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
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


@dataclass(frozen=True)
class PhasePeaks:
    """The peak at any micro-batch: the largest of the step's phases, each a line in the micro-batch."""

    phases: tuple[tuple[str, LinearPeak], ...]

    def at(self, micro_batch_size: int) -> float:
        return max(line.at(micro_batch_size) for _, line in self.phases)


def fit_linear(one: Simulation, two: Simulation) -> PhasePeaks:
    """Per phase of the step, the line through the peaks of `one` and `two` (the same setup at two micro-batches);
    the peak is the largest phase. Beyond `two` a lower bound of the simulated peak (convexity)."""
    lines = []
    for phase, peak_one in _phases(one).items():
        per_sample = max(_phases(two)[phase] - peak_one, 0) / (two.micro_batch_size - one.micro_batch_size)
        lines.append((phase, LinearPeak(peak_one - per_sample * one.micro_batch_size, per_sample)))
    return PhasePeaks(tuple(lines))


def _phases(sim: Simulation) -> dict[str, int]:
    return sim.phase_peak_bytes or {"step": sim.peak_bytes}


@dataclass(frozen=True)
class BaseQuantization:
    """QLoRA's base: the frozen Linear weights of the repeated blocks stored at `bytes_per_param` (NF4: 4 bits
    + block constants) instead of their dtype's. The rest of the model (embeddings, output head, norms, biases,
    adapters) keeps its dtype, as bitsandbytes/torchao QLoRA does."""

    kind: str  # nf4 | int8
    bytes_per_param: float
    elements: int  # frozen Linear weight elements in the repeated blocks
    weight_bytes: int  # the same weights in their dtype, as simulated
    largest_elements: int  # the largest of those weights: one layer dequantized at a time

    @property
    def stored_bytes(self) -> int:
        return math.ceil(self.elements * self.bytes_per_param)

    @property
    def saved_bytes(self) -> int:
        return self.weight_bytes - self.stored_bytes

    def dequantized_bytes(self, precision: str) -> int:
        """One layer's weight dequantized for its matmul, in the compute dtype (fp32, or 16-bit)."""
        return self.largest_elements * (4 if memory_class(precision) == "fp32" else 2)


def quantized_base(sim: Simulation, q: BaseQuantization) -> Simulation:
    """`sim` (a LoRA step, the base frozen in its dtype) with the base stored as `q` says: the frozen weights
    shrink by `q.saved_bytes`, and one layer's dequantized weight is held as a temporary. Forward and backward
    dequantize layer by layer, so one is alive at a time; it is added to every phase (the optimizer step too:
    an upper bound by one layer, which keeps the breakdown the peak phase's). Activations are unchanged."""
    temp = q.dequantized_bytes(sim.precision)
    delta = temp - q.saved_bytes
    breakdown = dict(sim.breakdown)
    breakdown["parameters"] -= q.saved_bytes  # frozen weights are filed there (held as buffers)
    breakdown["temporaries"] = breakdown.get("temporaries", 0) + temp
    assert breakdown["parameters"] >= 0, (sim.breakdown, q)
    return replace(sim, peak_bytes=sim.peak_bytes + delta, breakdown=breakdown,
                   phase_peak_bytes={k: v + delta for k, v in sim.phase_peak_bytes.items()},
                   notes=[*sim.notes, f"qlora: base Linear weights at {q.bytes_per_param:.3f} bytes/param ({q.kind})"])


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

    `predicted(b)` is the cheap estimate (the lines of `fit_linear`, corrected) that rules sizes out; `confirmed(b)`,
    when given, is the expensive one (a simulation at b, corrected) that must agree before a size is taken. With a
    prediction that never exceeds the confirmed need (the lines are lower bounds), the answer is exactly the largest
    size whose confirmed need fits.
    """
    for b in candidate_micro_batches(per_gpu_batch):
        if limit is not None and b > limit:
            continue
        if predicted(b) > usable_bytes:
            continue
        if confirmed is None or confirmed(b) <= usable_bytes:
            return b
    return None
