"""Accelerators in one table: which device `train.device` means, and what it supports.

Adding an accelerator is one `Accelerator` entry: how to tell it is present, how to synchronize,
how to read and reset its peak memory, and how to drop its cached memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from trainforge.errors import UserError


def _module(name: str):
    return getattr(torch, name, None)


@dataclass(frozen=True)
class Accelerator:
    kind: str  # torch device type
    available: Callable[[], bool]
    count: Callable[[], int]

    @property
    def backend(self):
        return _module(self.kind)


def _avail(kind: str) -> Callable[[], bool]:
    def check() -> bool:
        mod = _module(kind)
        try:
            return bool(mod is not None and mod.is_available())
        except Exception:  # a half-installed backend must not break device detection
            return False

    return check


def _count(kind: str) -> Callable[[], int]:
    def count() -> int:
        mod = _module(kind)
        if mod is None or not _avail(kind)():
            return 0
        return int(getattr(mod, "device_count", lambda: 1)())

    return count


# Order is preference for `device: auto`.
ACCELERATORS: dict[str, Accelerator] = {
    k: Accelerator(k, _avail(k), _count(k)) for k in ("cuda", "xpu", "npu", "mps")
}


def resolve_device(spec: str = "auto", *, local_rank: Optional[int] = None, present: bool = True) -> torch.device:
    """THE decision of the device a process computes on, from `train.device` (auto | cpu | cuda[:i] | mps | ...): a
    run, a process of a group, evaluation, generation, calibration and the job admission all take it from here.

    `auto` picks the best accelerator present, else the CPU; `cuda:1` etc. are checked to exist. `local_rank`: a
    process of a group on this node (torchrun): its own GPU, cuda:<local_rank>, or the CPU (auto, cuda, cpu only).
    `present=False`: a device of that kind that another process will have (the admission sizes a job for a GPU
    slot), named without being looked for here."""
    if not present:
        return torch.device(spec.partition(":")[0] if spec != "auto" else "cuda")
    if local_rank is not None:
        return _group_device(spec, local_rank)
    if spec == "auto":
        for acc in ACCELERATORS.values():
            if acc.available():
                return torch.device(acc.kind, 0) if acc.kind != "mps" else torch.device("mps")
        return torch.device("cpu")
    kind, _, index = spec.partition(":")
    if kind == "cpu":
        return torch.device("cpu")
    acc = ACCELERATORS.get(kind)
    if acc is None or not acc.available():
        raise UserError(f"train.device: {spec!r} is not available on this machine; use train.device=auto or cpu")
    idx = int(index) if index.isdigit() else 0
    if idx >= max(acc.count(), 1):
        raise UserError(f"train.device: {spec!r} does not exist ({acc.count()} {kind} device(s)); pick an index below that")
    return torch.device(kind, idx) if kind != "mps" else torch.device("mps")


def _group_device(spec: str, local_rank: int) -> torch.device:
    kind = spec.split(":", 1)[0]
    if kind in ("auto", "cuda") and ACCELERATORS["cuda"].available():
        return torch.device("cuda", local_rank)
    if kind in ("auto", "cpu"):
        return torch.device("cpu")
    raise UserError(f"train.device: {spec!r} is not supported in a distributed run; use auto, cuda or cpu")


def gpu_count() -> int:
    """The CUDA GPUs this process sees (CUDA_VISIBLE_DEVICES applied): what parallel trials are placed on."""
    return ACCELERATORS["cuda"].count()


def synchronize(device: torch.device) -> None:
    mod = _module(device.type) if device.type != "cpu" else None
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    mod = _module(device.type) if device.type != "cpu" else None
    if mod is not None and hasattr(mod, "reset_peak_memory_stats"):
        mod.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> Optional[int]:
    """Peak allocated bytes since the last reset; None where the backend does not report it (CPU)."""
    mod = _module(device.type) if device.type != "cpu" else None
    if mod is not None and hasattr(mod, "max_memory_allocated"):
        return int(mod.max_memory_allocated(device))
    return None


def empty_cache(device: torch.device) -> None:
    mod = _module(device.type) if device.type != "cpu" else None
    if mod is not None and hasattr(mod, "empty_cache"):
        mod.empty_cache()


def supports_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return device.type in ("xpu", "npu")


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error from any backend (torch.OutOfMemoryError is CUDA's; others say so in text)."""
    if isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
