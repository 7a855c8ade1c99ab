"""`train.micro_batch_size: auto`: the largest micro-batch whose simulated step fits this device.

Budget: on CUDA the free memory `mem_get_info` reports (the CUDA context already exists, so its term is
left out); on the CPU `train.memory_budget_bytes`, default half of the memory available now. The
prediction is the linear memory model of `planning.memory` plus the device's correction terms, and the
chosen size is confirmed by simulating it. The loop's out-of-memory recovery stays the safety net.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trainforge.config import Config
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.hardware.catalog import load_catalog
from trainforge.planning.calibration_store import load_calibration
from trainforge.planning.corrections import applicable, corrected_peak_bytes
from trainforge.planning.local import available_memory_bytes
from trainforge.planning.memory import SAFETY_MARGIN, SimKey, candidate_micro_batches, fit_linear
from trainforge.planning.plan import Planner

CPU_BUDGET_SHARE = 0.5


@dataclass(frozen=True)
class AutoChoice:
    micro_batch_size: int
    predicted_peak_bytes: int
    budget_bytes: int


def memory_budget_bytes(cfg: Config, device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if cfg.train.memory_budget_bytes is not None:
        return cfg.train.memory_budget_bytes
    return int(available_memory_bytes() * CPU_BUDGET_SHARE)


def auto_micro_batch(cfg: Config, info: DataInfo, device: torch.device, precision: str, *,
                     steps: int, world_size: int = 1) -> AutoChoice:
    planner = Planner(cfg, info=info, steps=steps)
    budget = memory_budget_bytes(cfg, device)
    usable = budget * SAFETY_MARGIN
    terms = [t for t in applicable(device.type, world_size, planner.facts.convolutional) if t.name != "cuda_context"]
    factor = None
    if device.type == "cuda":
        factor = load_calibration().get(_catalog_name(device), {}).get("memory_factor")

    def corrected(peak: float) -> int:
        return corrected_peak_bytes(int(peak), terms, factor)[0]

    key = SimKey("none", 1, False, "fp32" if precision == "fp32" else "bf16")
    per_device = cfg.train.global_batch_size // world_size
    one = planner.cache.get(key, 1)
    if corrected(one.peak_bytes) > usable:
        raise UserError(
            f"train.micro_batch_size: auto found no micro-batch that fits: a micro-batch of 1 needs "
            f"{corrected(one.peak_bytes) / 2**20:.0f} MiB, the budget allows {usable / 2**20:.0f} MiB; "
            "raise train.memory_budget_bytes, use a larger device or a smaller model"
        )
    line = fit_linear(one, planner.cache.get(key, 2)) if per_device >= 2 else None
    for b in candidate_micro_batches(per_device):
        if line is not None and corrected(line.at(b)) > usable:
            continue
        peak = corrected(planner.cache.get(key, b).peak_bytes)  # confirm the linear prediction
        if peak <= usable:
            return AutoChoice(b, peak, budget)
    return AutoChoice(1, corrected(one.peak_bytes), budget)


def _catalog_name(device: torch.device) -> str:
    spec = load_catalog().match_device_name(torch.cuda.get_device_name(device))
    return spec.name if spec else ""
