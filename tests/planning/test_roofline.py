"""The roofline's pure functions."""
from __future__ import annotations

import pytest

from trainforge.planning.corrections import TERMS, applicable, corrected_peak_bytes
from trainforge.planning.roofline import (
    bus_bandwidth,
    default_efficiency,
    ring_allreduce_s,
    run_totals,
    step_time,
)

H100 = dict(peak_flops=989e12, bandwidth_bytes_per_s=3.35e12, interconnect_bytes_per_s=900e9)


def test_ring_allreduce_formula():
    # 2 (n-1)/n x bytes / bandwidth
    assert ring_allreduce_s(1e9, 8, 100e9) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9)
    assert ring_allreduce_s(1e9, 1, 100e9) == 0.0


def test_bus_bandwidth_is_one_direction_and_inter_node_limited():
    assert bus_bandwidth(900e9, 8) == pytest.approx(450e9 * 0.8)
    assert bus_bandwidth(900e9, 16) == pytest.approx(50e9 * 0.8)


def test_compute_bound_step_scales_with_flops_and_efficiency():
    kw = dict(H100, bytes_moved_per_gpu=1e9, kernels_per_step=100, strategy="none", num_gpus=1, accumulation=1,
              grad_bytes=0, param_bytes=0)
    t = step_time(hardware_flops_per_gpu=989e12, efficiency=0.5, **kw)
    assert t.bound == "compute" and t.step_time_s == pytest.approx(2.0)
    assert step_time(hardware_flops_per_gpu=2 * 989e12, efficiency=0.5, **kw).step_time_s == pytest.approx(4.0)


def test_tiny_models_hit_the_launch_floor():
    t = step_time(hardware_flops_per_gpu=1e6, efficiency=0.3, bytes_moved_per_gpu=1e3, kernels_per_step=400,
                  strategy="none", num_gpus=1, accumulation=1, grad_bytes=0, param_bytes=0, **H100)
    assert t.bound == "launch" and t.step_time_s == pytest.approx(400 * 5e-6)


def test_ddp_communication_is_partly_hidden():
    kw = dict(H100, bytes_moved_per_gpu=0, kernels_per_step=0, efficiency=1.0, accumulation=1, param_bytes=0,
              hardware_flops_per_gpu=989e12 * 0.01, strategy="ddp")  # 10 ms of compute
    small = step_time(num_gpus=8, grad_bytes=1e6, **kw)
    assert small.exposed_comm_s == 0.0 and small.step_time_s == pytest.approx(0.01)
    big = step_time(num_gpus=8, grad_bytes=10e9, **kw)
    assert big.exposed_comm_s == pytest.approx(big.comm_s - 0.7 * (2 / 3) * 0.01)
    assert big.bound == "communication"


def test_fsdp_gathers_every_micro_batch():
    kw = dict(H100, bytes_moved_per_gpu=0, kernels_per_step=0, efficiency=1.0, hardware_flops_per_gpu=0.0,
              strategy="fsdp", num_gpus=8, grad_bytes=1e9, param_bytes=1e9)
    one = step_time(accumulation=1, **kw).comm_s
    four = step_time(accumulation=4, **kw).comm_s
    unit = 7 / 8 * 1e9 / bus_bandwidth(900e9, 8)
    assert one == pytest.approx(3 * unit) and four == pytest.approx(9 * unit)


def test_default_efficiency_follows_the_reference():
    small = default_efficiency(124e6, "transformer", hopper_or_newer=False, compiled=True)
    assert (small.low, small.high) == pytest.approx((0.30, 0.35))
    eager_h100 = default_efficiency(13e9, "transformer", hopper_or_newer=True, compiled=False)
    assert eager_h100.high == pytest.approx(0.50 * 0.9 * 0.8)
    assert default_efficiency(25e6, "conv", False, True).mid < small.mid


def test_totals():
    t = run_totals(step_time_s=2.0, steps=3600, num_gpus=4, usd_per_gpu_hour=2.5, tdp_watts=700)
    assert t["total_time_s"] == 7200 and t["cost_usd"] == pytest.approx(2 * 4 * 2.5)
    assert t["energy_kwh"] == pytest.approx(2 * 4 * 0.7)
    assert run_totals(1.0, 10, 1, None, 100)["cost_usd"] is None


def test_corrections_only_on_gpus_and_each_has_a_source():
    assert applicable("cpu", 8, True) == []
    names = {t.name for t in applicable("cuda", 1, False)}
    assert names == {"cuda_context", "cublas_workspace", "allocator"}
    assert "nccl_buffers" in {t.name for t in applicable("cuda", 2, False)}
    assert "cudnn_workspace" in {t.name for t in applicable("cuda", 1, True)}
    assert all(t.source for t in TERMS)
    peak, added = corrected_peak_bytes(10 * 2**30, applicable("cuda", 1, False))
    assert added["allocator"] == pytest.approx(0.08 * 10 * 2**30, rel=1e-6)
    assert peak == 10 * 2**30 + sum(added.values())
    calibrated, added = corrected_peak_bytes(10 * 2**30, applicable("cuda", 1, False), calibrated_factor=1.2)
    assert added["allocator"] == pytest.approx(0.2 * 10 * 2**30, rel=1e-6)
