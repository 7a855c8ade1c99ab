"""The machine the command runs on, as a catalog entry: its GPU from the catalog, or the CPU."""
from __future__ import annotations

import os
from typing import Optional

import torch

from trainforge.errors import UserError
from trainforge.hardware.catalog import Catalog, GPUSpec

# Nominal CPU figures: 32 fp32 FLOP/cycle per core (two AVX2 FMA units) at 2.5 GHz, ~20 GB/s of
# memory bandwidth per socket share. Rough on purpose: `trainforge plan --calibrate` measures the
# real step time on this CPU and stores the correction.
CPU_FLOPS_PER_CORE = 32 * 2.5e9
CPU_BANDWIDTH_BYTES_PER_S = 20e9
CPU_TDP_WATTS = 65.0


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), else total RAM."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_spec() -> GPUSpec:
    cores = torch.get_num_threads()
    peak = cores * CPU_FLOPS_PER_CORE
    return GPUSpec(
        name="cpu", aliases=("cpu",), memory_bytes=available_memory_bytes(), memory_basis="available",
        memory_bandwidth_bytes_per_s=CPU_BANDWIDTH_BYTES_PER_S,
        peak_flops={"bf16": peak, "fp16": peak, "tf32": peak, "fp32": peak, "fp8": None},
        cuda_cores=None, sm_count=None, tdp_watts=CPU_TDP_WATTS, interconnect_kind="pcie",
        interconnect_bytes_per_s=CPU_BANDWIDTH_BYTES_PER_S, pcie_gen=None,
        source=f"nominal: {cores} threads x 32 FLOP/cycle x 2.5 GHz; calibrate with trainforge plan --calibrate",
        verify=("peak_flops.fp32", "memory_bandwidth_bytes_per_s"),
    )


def spec_for(name: str, catalog: Catalog) -> GPUSpec:
    return cpu_spec() if name.lower() == "cpu" else catalog.get(name)


def local_spec(device: torch.device, catalog: Catalog) -> GPUSpec:
    """The catalog entry of `device` (CUDA: matched by the name torch reports), or the CPU."""
    if device.type == "cpu":
        return cpu_spec()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        spec: Optional[GPUSpec] = catalog.match_device_name(name)
        if spec is None:
            raise UserError(
                f"this GPU ({name}) is not in the catalog; add it to a catalog file and pass --catalog "
                "(see docs/gpus.md)"
            )
        return spec
    raise UserError(f"train.device: planning for {device.type} devices is not supported yet; use cuda or cpu")
