"""Device selection and precision: one table of accelerators, CPU fallbacks, autocast and loss scaling."""
from __future__ import annotations

import pytest
import torch

from trainforge.errors import UserError
from trainforge.hardware import device as dev
from trainforge.engine.precision import autocast, make_scaler, resolve_precision

HAS_CUDA = torch.cuda.is_available()


def test_auto_picks_cpu_without_accelerators(monkeypatch):
    for acc in list(dev.ACCELERATORS):
        monkeypatch.setitem(dev.ACCELERATORS, acc, dev.Accelerator(acc, lambda: False, lambda: 0))
    assert dev.resolve_device("auto") == torch.device("cpu")


def test_auto_prefers_the_first_present_accelerator(monkeypatch):
    """Adding an accelerator is one table entry; `auto` takes the first one present."""
    monkeypatch.setattr(dev, "ACCELERATORS", {
        "cuda": dev.Accelerator("cuda", lambda: False, lambda: 0),
        "xpu": dev.Accelerator("xpu", lambda: True, lambda: 2),
    })
    assert dev.resolve_device("auto") == torch.device("xpu", 0)
    assert dev.resolve_device("xpu:1") == torch.device("xpu", 1)
    with pytest.raises(UserError, match="train.device: 'xpu:2' does not exist"):
        dev.resolve_device("xpu:2")
    with pytest.raises(UserError, match="train.device: 'cuda' is not available"):
        dev.resolve_device("cuda")


def test_cpu_is_always_there():
    assert dev.resolve_device("cpu") == torch.device("cpu")
    assert dev.peak_memory_bytes(torch.device("cpu")) is None


def test_oom_is_recognised_from_any_backend():
    assert dev.is_oom(torch.OutOfMemoryError("CUDA out of memory"))
    assert dev.is_oom(RuntimeError("XPU out of memory. Tried to allocate 2 GiB"))
    assert not dev.is_oom(RuntimeError("shape mismatch"))


def test_precision_auto_is_fp32_on_cpu_and_explicit_choices_stay():
    assert resolve_precision("auto", "cpu", bf16_supported=True) == ("fp32", "auto: fp32 on the CPU")
    assert resolve_precision("bf16", "cpu", bf16_supported=False) == ("bf16", None)  # CPU autocast has bf16
    assert resolve_precision("fp32", "cuda", bf16_supported=True) == ("fp32", None)


def test_auto_precision_on_gpus_by_bf16_support():
    assert resolve_precision("auto", "cuda", bf16_supported=True)[0] == "bf16"
    precision, why = resolve_precision("auto", "cuda", bf16_supported=False)
    assert precision == "fp16" and "no bf16" in why  # V100, T4: fp16 with loss scaling
    precision, why = resolve_precision("bf16", "cuda", bf16_supported=False)
    assert precision == "fp16" and "not supported" in why
    assert resolve_precision("fp16", "cuda", bf16_supported=True) == ("fp16", None)


def test_bf16_autocast_on_cpu_runs_matmuls_in_bf16():
    lin = torch.nn.Linear(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert lin(torch.randn(2, 4)).dtype == torch.float32


def test_grad_scaler_only_for_fp16():
    assert make_scaler(torch.device("cpu"), "fp16").is_enabled()
    assert not make_scaler(torch.device("cpu"), "bf16").is_enabled()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_peak_memory_is_reported():
    d = dev.resolve_device("cuda")
    dev.reset_peak_memory(d)
    x = torch.empty(1 << 20, device=d)
    assert dev.peak_memory_bytes(d) >= x.numel() * 4
