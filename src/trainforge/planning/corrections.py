"""What the simulated peak leaves out on a real GPU, as data with sources, and how it is added.

The fake-tensor simulation sees every tensor the training step allocates; it does not see memory the
CUDA runtime and libraries hold outside tensors, nor the caching allocator's overhead. Each term
below is added to (or multiplies) the simulated peak for a GPU target. `trainforge plan --calibrate`
measures the real peak on the local GPU and stores a per-device factor that replaces the guesswork
of the fragmentation term there.
"""
from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int  # added once per GPU (0 for a pure factor)
    factor: float  # multiplies the simulated peak (1.0 for a pure addition)
    applies: str  # "gpu" | "conv" (convolutional models) | "multi_gpu"
    source: str


TERMS: tuple[Term, ...] = (
    Term("cuda_context", 512 * MiB, 1.0, "gpu",
         "CUDA context + kernel images, 0.3-2 GiB depending on GPU and libraries (docs/gpu-facts.md); "
         "512 MiB for a PyTorch process with cuBLAS loaded"),
    Term("cublas_workspace", 32 * MiB, 1.0, "gpu",
         "cuBLAS workspace, CUBLAS_WORKSPACE_CONFIG=:4096:8 = 8 x 4 MiB per stream (PyTorch's default on Hopper)"),
    Term("cudnn_workspace", 256 * MiB, 1.0, "conv",
         "cuDNN convolution workspace chosen by the benchmark heuristics; up to a few hundred MiB "
         "(heuristic; calibrate)"),
    Term("allocator", 0, 1.08, "gpu",
         "caching allocator: 512 B rounding, 2 MiB blocks for large tensors, fragmentation; reserved/allocated "
         "is typically 1.05-1.15 in steady-state training (heuristic; --calibrate measures it)"),
    Term("nccl_buffers", 384 * MiB, 1.0, "multi_gpu",
         "NCCL communicator buffers (NCCL_BUFFSIZE 4 MiB per channel and peer) plus DDP's 25 MiB gradient "
         "buckets with gradient_as_bucket_view (heuristic; calibrate)"),
)


def applicable(device_type: str, world_size: int, convolutional: bool) -> list[Term]:
    if device_type != "cuda":
        return []  # the CPU has no context, workspaces or caching allocator worth modelling
    wanted = {"gpu"} | ({"conv"} if convolutional else set()) | ({"multi_gpu"} if world_size > 1 else set())
    return [t for t in TERMS if t.applies in wanted]


def corrected_peak_bytes(
    simulated_peak_bytes: int, terms: list[Term], calibrated_factor: float | None = None
) -> tuple[int, dict[str, int]]:
    """(predicted peak on the device, bytes each term added). A calibration replaces the allocator factor."""
    added: dict[str, int] = {}
    peak = float(simulated_peak_bytes)
    for t in terms:
        factor = calibrated_factor if (t.name == "allocator" and calibrated_factor) else t.factor
        if factor != 1.0:
            added[t.name] = int(simulated_peak_bytes * (factor - 1.0))
        if t.bytes:
            added[t.name] = added.get(t.name, 0) + t.bytes
    peak += sum(added.values())
    return int(peak), added
