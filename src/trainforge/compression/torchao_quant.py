"""The PyTorch-native alternative: torchao weight quantization of every Linear layer, measured in PyTorch.

    row = torchao_variant(model, "torchao-int8", test, reference, out_dir, params, flops, task, bench_s=1.0)

`torchao-int8` (Int8WeightOnlyConfig) runs on CUDA and on the CPU; `torchao-float8`
(Float8WeightOnlyConfig) needs a CUDA GPU with float8 support (compute capability 8.9+: L40S, 4090, H100).
The quantized model stays a torch module (weights are torchao tensor subclasses), so it suits serving
from PyTorch on a GPU; the ONNX variants suit CPUs and edge devices. Its artifact is the quantized
state dict (`torch.save`; loading it needs torchao and `weights_only=False`).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from trainforge.compression.bench import batch_latencies, variant_row
from trainforge.errors import UserError
from trainforge.hardware.device import resolve_device

CONFIGS = {"torchao-int8": "Int8WeightOnlyConfig", "torchao-float8": "Float8WeightOnlyConfig"}  # torchao.quantization


def quantize_linear_weights(model: nn.Module, kind: str, device: torch.device) -> nn.Module:
    """A copy of `model` on `device` with each Linear's weight quantized by torchao."""
    try:
        import torchao.quantization as tq  # optional (torchao, the [gpu] extra): only torchao variants need it
    except ImportError as exc:
        raise UserError(f"--quantize {kind}: torchao is not installed; pip install 'trainforge[gpu]'") from exc
    if kind == "torchao-float8" and device.type != "cuda":
        raise UserError("--quantize torchao-float8 needs a CUDA GPU (compute capability 8.9+); use torchao-int8 or int8")
    quantized = copy.deepcopy(model).to(device).eval()
    tq.quantize_(quantized, getattr(tq, CONFIGS[kind])())
    return quantized


def torchao_variant(model: nn.Module, kind: str, test: Any, reference: np.ndarray, out_dir: Path, params: int,
                    flops: int, task: str, bench_s: float, device: Optional[str] = None) -> dict[str, Any]:
    """One row of the compression table for the torchao-quantized model (`reference`: fp32 test logits)."""
    dev = resolve_device(device or "auto")
    quantized = quantize_linear_weights(model, kind, dev)
    path = out_dir / f"{kind}.pt"
    torch.save(quantized.state_dict(), path)
    with torch.no_grad():
        logits = torch.cat([quantized(torch.from_numpy(test.inputs[i:i + 256]).to(dev)).float().cpu()
                            for i in range(0, len(test.inputs), 256)]).numpy()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def timed(batch: np.ndarray) -> Callable[[], None]:
        x = torch.from_numpy(batch).to(dev)

        def call() -> None:
            with torch.no_grad():
                quantized(x)
            sync()

        return call

    timings = batch_latencies(test.inputs, timed, budget_s=bench_s)
    return variant_row(kind, path, f"torch-{dev.type}", params, flops, logits, test.labels, task, reference, timings)
