"""Step time on a GPU from FLOPs, bytes and the catalog: a roofline with communication. Pure functions.

    t_step = max(compute, memory, launch) + exposed communication

compute = hardware FLOPs / (dense peak for the precision x efficiency)   efficiency = achieved MFU
memory  = bytes moved / memory bandwidth                                 (a floor for small, memory-bound models)
launch  = kernels per step x launch overhead                             (a floor for tiny models)
DDP:  ring all-reduce of the gradients once per optimizer step, 2 (n-1)/n x grad bytes / bus bandwidth
      (docs/gpu-facts.md), overlapped with the backward pass of the last micro-batch.
FSDP: per micro-batch an all-gather of the parameters for forward and again for backward, and once per
      step a reduce-scatter of the gradients: (n-1)/n x bytes / bus bandwidth each; overlapped with compute.
"""
from __future__ import annotations

from dataclasses import dataclass

LAUNCH_OVERHEAD_S = 5e-6  # eager PyTorch: ~4-10 us of CPU time per CUDA kernel launch [verify]
BUS_EFFICIENCY = 0.8  # achieved share of the link's one-direction bandwidth in NCCL rings (nccl-tests busbw) [verify]
OVERLAP = 0.7  # share of backward (DDP) or compute (FSDP) time that hides communication [heuristic]
BACKWARD_SHARE = 2 / 3  # backward is ~2x forward FLOPs
GPUS_PER_NODE = 8
INTER_NODE_BYTES_PER_S = 50e9  # 400 Gb/s InfiniBand per GPU, one direction


@dataclass(frozen=True)
class Efficiency:
    low: float
    mid: float
    high: float
    source: str


def default_efficiency(param_count: int, family: str, hopper_or_newer: bool, compiled: bool) -> Efficiency:
    """MFU defaults from docs/gpu-facts.md ("Sensible planner defaults"), as a range."""
    if family == "conv":
        low, high = 0.18, 0.28
        source = "ResNet-50 mixed-precision training reaches ~2,700 img/s on an A100 (~22% MFU) [verify]"
    elif param_count < 1e9:
        low, high, source = 0.30, 0.35, "small transformers (<1B): 0.30-0.35"
    elif param_count < 7e9:
        low, high, source = 0.38, 0.45, "1-7B transformers: 0.38-0.45"
    else:
        low, high, source = 0.40, 0.50, "large transformers: 0.40-0.50"
    scale = 1.0
    if hopper_or_newer and family != "conv":
        scale *= 0.9
        source += "; x0.9 on Hopper and newer (MosaicML H100 figures run lower than A100's)"
    if not compiled:
        scale *= 0.8
        source += "; x0.8 eager (no torch.compile)"
    low, high = low * scale, high * scale
    return Efficiency(low, (low + high) / 2, high, source)


def compute_time_s(flops: float, peak_flops: float, efficiency: float) -> float:
    return flops / (peak_flops * efficiency)


def memory_time_s(bytes_moved: float, bandwidth_bytes_per_s: float) -> float:
    return bytes_moved / bandwidth_bytes_per_s


def bus_bandwidth(interconnect_bytes_per_s: float, num_gpus: int) -> float:
    """One-direction achievable bandwidth of the ring: the datasheet figure is both directions together."""
    per_direction = interconnect_bytes_per_s / 2 * BUS_EFFICIENCY
    if num_gpus > GPUS_PER_NODE:
        per_direction = min(per_direction, INTER_NODE_BYTES_PER_S * BUS_EFFICIENCY)
    return per_direction


def ring_allreduce_s(nbytes: float, num_gpus: int, bus_bytes_per_s: float) -> float:
    if num_gpus <= 1:
        return 0.0
    return 2 * (num_gpus - 1) / num_gpus * nbytes / bus_bytes_per_s


def ring_collective_s(nbytes: float, num_gpus: int, bus_bytes_per_s: float) -> float:
    """All-gather or reduce-scatter of `nbytes` in total."""
    if num_gpus <= 1:
        return 0.0
    return (num_gpus - 1) / num_gpus * nbytes / bus_bytes_per_s


@dataclass(frozen=True)
class StepTime:
    step_time_s: float
    compute_s: float
    memory_s: float
    launch_s: float
    comm_s: float
    exposed_comm_s: float
    bound: str  # compute | memory | launch | communication


def step_time(
    *,
    hardware_flops_per_gpu: float,
    bytes_moved_per_gpu: float,
    kernels_per_step: int,
    peak_flops: float,
    bandwidth_bytes_per_s: float,
    efficiency: float,
    strategy: str,
    num_gpus: int,
    accumulation: int,
    grad_bytes: float,
    param_bytes: float,
    interconnect_bytes_per_s: float,
) -> StepTime:
    """Predicted time of one optimizer step on each of `num_gpus` GPUs."""
    compute = compute_time_s(hardware_flops_per_gpu, peak_flops, efficiency)
    memory = memory_time_s(bytes_moved_per_gpu, bandwidth_bytes_per_s)
    launch = kernels_per_step * LAUNCH_OVERHEAD_S
    busy = max(compute, memory, launch)
    bus = bus_bandwidth(interconnect_bytes_per_s, num_gpus)
    if strategy == "fsdp":
        comm = accumulation * 2 * ring_collective_s(param_bytes, num_gpus, bus) + ring_collective_s(grad_bytes, num_gpus, bus)
        hidden = OVERLAP * busy
    else:
        comm = ring_allreduce_s(grad_bytes, num_gpus, bus)
        hidden = OVERLAP * BACKWARD_SHARE * busy / max(accumulation, 1)  # only the last micro-batch's backward
    exposed = max(0.0, comm - hidden)
    total = busy + exposed
    bound = max(("compute", compute), ("memory", memory), ("launch", launch), key=lambda kv: kv[1])[0]
    if exposed > busy:
        bound = "communication"
    return StepTime(total, compute, memory, launch, comm, exposed, bound)


def dequantize_time_s(elements: int, stored_bytes_per_param: float, compute_bytes_per_param: int, passes: int,
                      bandwidth_bytes_per_s: float) -> float:
    """QLoRA's extra time per micro-batch: every pass over the blocks (forward, backward's input gradients, the
    recompute under activation checkpointing) dequantizes each quantized weight before its matmul — the packed
    weight read and the dequantized one written, at memory bandwidth, in a kernel of its own that does not
    overlap the matmuls. A floor: bitsandbytes' measured QLoRA steps run slower than this (calibrate)."""
    return passes * elements * (stored_bytes_per_param + compute_bytes_per_param) / bandwidth_bytes_per_s


def run_totals(step_time_s: float, steps: int, num_gpus: int, usd_per_gpu_hour: float | None, tdp_watts: float) -> dict:
    """Total time, cost = hours x GPUs x price, energy = hours x GPUs x TDP (an upper bound)."""
    total_s = step_time_s * steps
    hours = total_s / 3600
    return {
        "total_time_s": total_s,
        "cost_usd": None if usd_per_gpu_hour is None else hours * num_gpus * usd_per_gpu_hour,
        "energy_kwh": hours * num_gpus * tdp_watts / 1000,
    }
