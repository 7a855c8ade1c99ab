"""The planner's typed result: `Plan` (the recipe's simulated step, the candidates, the recommendation) and
`Candidate` (one GPU type x count). `Plan.to_json()` is the `plan --json` document of docs/architecture.md ("Contracts"), key for key
and in the same order; consumers (render, calibrate, the Python API) read attributes, not string keys.

A candidate that does not fit carries only gpu, num_gpus, precision, method, fits=False and the reason, in JSON
as in attributes (the other fields are None); one that fits carries everything but the reason. `method` is the
fine-tuning method (full | lora | qlora): a recipe with `model.lora` is planned for all three, any other is
`full`; `Plan.methods` then holds each method's own step side by side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

# the keys of a fitting candidate's JSON, in order (docs/architecture.md, "Contracts", names the contract subset; the rest are extras)
FIT_KEYS = (
    "gpu", "num_gpus", "precision", "method", "fits", "strategy", "activation_checkpointing", "micro_batch_size",
    "accumulation", "peak_bytes_per_gpu", "simulated_peak_bytes_per_gpu", "corrections_bytes", "memory_bytes",
    "step_time_s", "step_time_range_s", "calibrated_time_factor", "bound", "exposed_comm_s", "efficiency",
    "efficiency_range", "efficiency_source", "total_time_s", "cost_usd", "energy_kwh", "price_usd_per_hour",
    "price_source", "within_budget", "within_deadline",
)
NO_FIT_KEYS = ("gpu", "num_gpus", "precision", "method", "fits", "reason")
PICK_KEYS = ("gpu", "num_gpus", "method", "strategy", "micro_batch_size", "accumulation", "total_time_s", "cost_usd")
RANGE_KEYS = ("step_time_range_s", "efficiency_range")  # tuples here, lists in JSON


@dataclass(frozen=True)
class Candidate:
    """One GPU type x count: whether the recipe fits, how (strategy, micro-batch), how fast, at what cost."""

    gpu: str
    num_gpus: int
    precision: str
    fits: bool
    reason: Optional[str] = None  # why it does not fit; None when it fits
    method: str = "full"  # full | lora | qlora: what trains (every weight, adapters, adapters on an NF4 base)
    # memory: the chosen strategy and micro-batch
    strategy: Optional[str] = None  # none | ddp | fsdp
    activation_checkpointing: Optional[bool] = None
    micro_batch_size: Optional[int] = None
    accumulation: Optional[int] = None
    peak_bytes_per_gpu: Optional[int] = None  # simulated peak plus correction terms
    simulated_peak_bytes_per_gpu: Optional[int] = None
    model_flops_per_sample: Optional[float] = None  # forward + backward, no recompute: what MFU counts
    corrections_bytes: Optional[dict[str, int]] = None
    memory_bytes: Optional[int] = None  # the GPU's
    # time: the roofline at the mid efficiency (range: high and low efficiency), times any calibration
    step_time_s: Optional[float] = None
    step_time_range_s: Optional[tuple[float, float]] = None
    calibrated_time_factor: Optional[float] = None
    bound: Optional[str] = None
    exposed_comm_s: Optional[float] = None
    efficiency: Optional[float] = None
    efficiency_range: Optional[tuple[float, float]] = None
    efficiency_source: Optional[str] = None
    # price: the whole run
    total_time_s: Optional[float] = None
    cost_usd: Optional[float] = None  # None without a price (the CPU)
    energy_kwh: Optional[float] = None
    price_usd_per_hour: Optional[float] = None
    price_source: Optional[str] = None
    within_budget: Optional[bool] = None  # None without a budget or a price
    within_deadline: Optional[bool] = None  # None without a deadline

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in FIT_KEYS if self.fits else NO_FIT_KEYS:
            value = getattr(self, key)
            if key in RANGE_KEYS:
                value = list(value)
            elif key == "corrections_bytes":
                value = dict(value)
            out[key] = value
        return out

    def pick(self) -> dict[str, Any]:
        """The short form the recommendation shows."""
        return {k: getattr(self, k) for k in PICK_KEYS}


@dataclass(frozen=True)
class Recommendation:
    fastest: Optional[Candidate]
    cheapest: Optional[Candidate]
    recommended: Optional[Candidate]  # the cheapest within budget and deadline
    reason: Optional[str] = None  # why there is no recommendation

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "fastest": None if self.fastest is None else self.fastest.pick(),
            "cheapest": None if self.cheapest is None else self.cheapest.pick(),
            "recommended": None if self.recommended is None else self.recommended.pick(),
        }
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class StepSimulation:
    """The recipe's own step (its micro-batch, one device, no parallelism), simulated."""

    micro_batch_size: int
    precision: str
    peak_bytes: int  # no correction terms
    breakdown: dict[str, int]
    param_count: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    samples_per_step: int
    tokens_per_step: int
    accumulation: int
    simulations_run: int

    def to_json(self) -> dict[str, Any]:
        return {
            "micro_batch_size": self.micro_batch_size,
            "precision": self.precision,
            "peak_bytes": self.peak_bytes,
            "breakdown": dict(self.breakdown),
            "param_count": self.param_count,
            "model_flops_per_step": self.model_flops_per_step,
            "hardware_flops_per_step": self.hardware_flops_per_step,
            "samples_per_step": self.samples_per_step,
            "tokens_per_step": self.tokens_per_step,
            "accumulation": self.accumulation,
            "simulations_run": self.simulations_run,
        }


@dataclass(frozen=True)
class Plan:
    recipe: str
    steps: int
    global_batch_size: int
    simulation: StepSimulation
    candidates: tuple[Candidate, ...]  # ranked: fitting first, then priced, cheapest, fastest
    recommendation: Recommendation
    # a fine-tuning recipe's methods side by side (full, lora, qlora: each one's own step); None otherwise
    methods: Optional[dict[str, StepSimulation]] = None

    def to_json(self) -> dict[str, Any]:
        """The `plan --json` document ("methods" only for a fine-tuning recipe)."""
        out = {
            "recipe": self.recipe,
            "steps": self.steps,
            "global_batch_size": self.global_batch_size,
            "simulation": self.simulation.to_json(),
            "candidates": [c.to_json() for c in self.candidates],
            "recommendation": self.recommendation.to_json(),
        }
        if self.methods is not None:
            out["methods"] = {name: sim.to_json() for name, sim in self.methods.items()}
        return out
