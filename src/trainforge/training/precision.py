"""Mixed precision: which dtype `train.precision` means on a device, autocast, and the fp16 GradScaler."""
from __future__ import annotations

import contextlib
import warnings
from typing import ContextManager

import torch

from trainforge.hardware.device import supports_bf16

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(spec: str, device: torch.device) -> str:
    """`auto`: bf16 where the accelerator supports it, fp16 on older GPUs, fp32 on the CPU."""
    if spec == "auto":
        if device.type == "cpu":
            return "fp32"
        return "bf16" if supports_bf16(device) else "fp16"
    if spec == "bf16" and device.type not in ("cpu",) and not supports_bf16(device):
        warnings.warn(f"train.precision=bf16 is not supported on {device}; using fp16 with loss scaling")
        return "fp16"
    return spec


def autocast(device: torch.device, precision: str) -> ContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def make_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Loss scaling is needed only for fp16; a disabled scaler keeps the loop free of branches."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
