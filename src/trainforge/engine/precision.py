"""Mixed precision: which dtype `train.precision` means on a device, autocast, and the fp16 GradScaler."""
from __future__ import annotations

import contextlib
from typing import ContextManager, Optional

import torch


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(requested: str, device_type: str, bf16_supported: bool) -> tuple[str, Optional[str]]:
    """(precision, why) for `train.precision` on a device; why is None when the request is taken as it is.

    THE one place precision is decided: the run's setup, the planner (per catalog GPU) and the job admission
    call it. `auto`: bf16 where the accelerator supports it, fp16 (with loss scaling) on older GPUs, fp32 on
    the CPU; an explicit bf16 on a GPU without it becomes fp16.
    """
    if requested == "auto":
        if device_type == "cpu":
            return "fp32", "auto: fp32 on the CPU"
        if bf16_supported:
            return "bf16", f"auto: this {device_type} device supports bf16"
        return "fp16", f"auto: this {device_type} device has no bf16; fp16 with loss scaling"
    if requested == "bf16" and device_type != "cpu" and not bf16_supported:
        return "fp16", f"bf16 is not supported on this {device_type} device; fp16 with loss scaling instead"
    return requested, None


def autocast(device: torch.device, precision: str) -> ContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def make_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling is needed only for fp16; a disabled scaler keeps the loop free of branches."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
