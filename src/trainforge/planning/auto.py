"""`train.micro_batch_size: auto`: the largest micro-batch whose simulated step fits a memory budget.

    budget = device_budget(cfg.train.memory_budget_bytes, device)      # what this device has room for
    choice = auto_micro_batch(planner, key, per_device=32, budget=budget, device_type="cuda", world_size=2)

The run's resolver (`training.setup.resolve`) and the job admission both call `auto_micro_batch`, so `auto`
means one thing. Budget: on CUDA the free memory `mem_get_info` reports (the CUDA context already exists, so
its correction term is left out); on the CPU `train.memory_budget_bytes`, default half of the memory available
now; for a job, the largest slot of the server. The prediction is the linear memory model of
`planning.memory` plus the device's correction terms (and a calibrated memory factor, where one is stored),
and the size it proposes is confirmed by simulating it. The loop's out-of-memory recovery stays the safety net.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from trainforge.errors import UserError
from trainforge.hardware.catalog import load_catalog
from trainforge.planning.calibration_store import load_calibration
from trainforge.planning.corrections import Term, applicable, corrected_peak_bytes
from trainforge.planning.local import available_memory_bytes
from trainforge.planning.memory import SAFETY_MARGIN, SimKey, fit_linear, largest_fitting
from trainforge.planning.plan import Planner

CPU_BUDGET_SHARE = 0.5


@dataclass(frozen=True)
class MemoryBudget:
    budget_bytes: int
    source: str  # where the figure comes from, e.g. "free CUDA memory": said with the choice
    context_counted: bool = False  # True for free memory measured after the CUDA context was made: its term is out


@dataclass(frozen=True)
class AutoChoice:
    micro_batch_size: int
    predicted_peak_bytes: int
    budget_bytes: int


def device_budget(memory_budget_bytes: Optional[int], device: torch.device) -> MemoryBudget:
    """This process's budget on `device` (`train.memory_budget_bytes` applies to the CPU)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return MemoryBudget(int(free), "free CUDA memory", context_counted=True)
    if memory_budget_bytes is not None:
        return MemoryBudget(memory_budget_bytes, "train.memory_budget_bytes")
    return MemoryBudget(int(available_memory_bytes() * CPU_BUDGET_SHARE), "half of the memory available now")


def memory_terms(device_type: str, world_size: int, convolutional: bool, budget: MemoryBudget) -> list[Term]:
    terms = applicable(device_type, world_size, convolutional)
    return [t for t in terms if not (budget.context_counted and t.name == "cuda_context")]


def memory_factor(device: torch.device) -> Optional[float]:
    """The calibrated allocator factor of this GPU (`trainforge plan --calibrate`), if one is stored."""
    if device.type != "cuda":
        return None
    spec = load_catalog().match_device_name(torch.cuda.get_device_name(device))
    return load_calibration().get(spec.name if spec else "", {}).get("memory_factor")


def predicted_peak_bytes(planner: Planner, key: SimKey, micro_batch_size: int, terms: list[Term],
                         factor: Optional[float] = None) -> int:
    """One device's predicted peak at `micro_batch_size`: the simulation at that size, corrected."""
    return corrected_peak_bytes(int(planner.cache.get(key, micro_batch_size).peak_bytes), terms, factor)[0]


def auto_micro_batch(planner: Planner, key: SimKey, *, per_device: int, budget: MemoryBudget, terms: list[Term],
                     factor: Optional[float] = None) -> AutoChoice:
    """The largest micro-batch dividing `per_device` whose corrected simulated peak fits the budget less the
    safety margin; UserError when not even 1 does."""
    usable = budget.budget_bytes * SAFETY_MARGIN

    def corrected(peak: float) -> int:
        return corrected_peak_bytes(int(peak), terms, factor)[0]

    line = fit_linear(planner.cache.get(key, 1), planner.cache.get(key, 2)) if per_device >= 2 else None
    micro = largest_fitting(
        per_device, usable,
        predicted=(lambda b: corrected(line.at(b))) if line is not None else (lambda b: 0),
        confirmed=lambda b: predicted_peak_bytes(planner, key, b, terms, factor),
    )
    if micro is None:
        raise UserError(
            f"train.micro_batch_size: auto found no micro-batch that fits: a micro-batch of 1 needs "
            f"{predicted_peak_bytes(planner, key, 1, terms, factor) / 2**20:.0f} MiB, {budget.source} allows "
            f"{usable / 2**20:.0f} MiB; raise train.memory_budget_bytes, use a larger device or a smaller model",
            public=True,
        )
    return AutoChoice(micro, predicted_peak_bytes(planner, key, micro, terms, factor), budget.budget_bytes)
