"""The server's slots: the GPUs jobs are packed onto, or CPU slots with a declared memory.

    parse_slots("auto")                       # every GPU nvidia-ml-py (pynvml) or torch.cuda sees; none: one CPU slot
    parse_slots("0,1")                        # GPUs 0 and 1 (their memory is detected)
    parse_slots("cpu:4", slot_memory_gb=4)    # four CPU slots of 4 GiB each (tests, CPU-only boxes)
    parse_slots("gpu:8", slot_memory_gb=80)   # a cluster node's 8 GPUs of 80 GiB (--backend slurm; not this machine's)
    gpu_stats()                               # live utilization and memory per GPU index, or None without pynvml

A GPU slot offers 90% of its memory to the scheduler (the planner's safety margin); a CPU slot offers
what was declared (default: the memory available now, split evenly).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trainforge.errors import UserError

GiB = 2**30
GPU_USABLE_SHARE = 0.9  # the planner's SAFETY_MARGIN: plan to use at most 90% of a device's memory


@dataclass(frozen=True)
class Slot:
    id: str  # "0", "1", ... (CUDA index) for GPUs; "cpu0", "cpu1", ... for CPU slots
    kind: str  # gpu | cpu
    name: str  # device name, e.g. "NVIDIA H100 80GB HBM3", or "cpu"
    memory_bytes: int  # what the scheduler may reserve on it
    total_bytes: int  # the device's memory (CPU: the declared memory)
    index: Optional[int] = None  # CUDA device index (gpu slots)

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "name": self.name, "memory_bytes": self.memory_bytes,
                "total_bytes": self.total_bytes, "index": self.index}


def parse_slots(spec: str, slot_memory_gb: Optional[float] = None) -> list[Slot]:
    """`--gpus auto|0,1,...|cpu:N` (+ `--slot-memory-gb`) -> the slot list; UserError naming the flag."""
    spec = spec.strip()
    if slot_memory_gb is not None and slot_memory_gb <= 0:
        raise UserError(f"--slot-memory-gb: expected a positive number of GiB, got {slot_memory_gb}")
    declared = None if slot_memory_gb is None else int(slot_memory_gb * GiB)
    if spec.startswith("gpu:"):  # a cluster node's GPUs (--backend slurm): not this machine's, so their memory is declared
        count_text = spec[4:]
        if not count_text.isdigit() or int(count_text) < 1:
            raise UserError(f"--gpus: expected gpu:N with N >= 1 (e.g. gpu:8), got {spec!r}")
        if declared is None:
            raise UserError("--gpus gpu:N describes the GPUs of a cluster node, which this machine cannot measure; "
                            "pass --slot-memory-gb (the memory of one of them, e.g. 80)")
        return [Slot(str(i), "gpu", "gpu", declared, declared, i) for i in range(int(count_text))]
    if spec.startswith("cpu"):
        count_text = spec[3:].removeprefix(":") or "1"
        if not count_text.isdigit() or int(count_text) < 1:
            raise UserError(f"--gpus: expected cpu:N with N >= 1 (e.g. cpu:4), got {spec!r}")
        return cpu_slots(int(count_text), declared)
    gpus = detect_gpus()
    if spec == "auto":
        if not gpus:
            return cpu_slots(1, declared)
        return [gpu_slot(i, name, total, declared) for i, (name, total) in sorted(gpus.items())]
    try:
        wanted = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--gpus: expected auto, GPU indices like 0,1 or cpu:N, got {spec!r}") from None
    if not wanted or len(set(wanted)) != len(wanted):
        raise UserError(f"--gpus: expected distinct GPU indices like 0,1, got {spec!r}")
    missing = [i for i in wanted if i not in gpus]
    if missing:
        have = ", ".join(str(i) for i in sorted(gpus)) or "none"
        raise UserError(f"--gpus: GPU {missing[0]} not found (this machine's GPUs: {have}); "
                        "pick existing indices or use cpu:N")
    return [gpu_slot(i, *gpus[i], declared) for i in wanted]


def cpu_slots(count: int, declared_bytes: Optional[int]) -> list[Slot]:
    if declared_bytes is None:
        from trainforge.planning.local import available_memory_bytes  # heavy (torch): the server starts without it

        declared_bytes = available_memory_bytes() // count
    return [Slot(f"cpu{i}", "cpu", "cpu", declared_bytes, declared_bytes) for i in range(count)]


def gpu_slot(index: int, name: str, total_bytes: int, declared_bytes: Optional[int]) -> Slot:
    usable = declared_bytes if declared_bytes is not None else int(total_bytes * GPU_USABLE_SHARE)
    return Slot(str(index), "gpu", name, usable, total_bytes, index)


def detect_gpus() -> dict[int, tuple[str, int]]:
    """CUDA index -> (name, total memory bytes): nvidia-ml-py when importable, else torch.cuda; {} without GPUs."""
    try:
        import pynvml  # optional (nvidia-ml-py, the [gpu] extra)
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            found = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                found[i] = (name.decode() if isinstance(name, bytes) else name, int(pynvml.nvmlDeviceGetMemoryInfo(h).total))
            return found
        except Exception:  # noqa: BLE001 - no driver: fall back to torch
            pass
    import torch  # heavy: the server starts without it

    if not torch.cuda.is_available():
        return {}
    return {i: (torch.cuda.get_device_name(i), int(torch.cuda.get_device_properties(i).total_memory))
            for i in range(torch.cuda.device_count())}


def gpu_stats() -> Optional[dict[int, dict[str, int]]]:
    """Live {index: {utilization_pct, used_bytes, total_bytes}} from pynvml; None when it is not importable
    or there is no driver (the dashboard then shows the slots' declared and reserved memory only)."""
    try:
        import pynvml  # optional (nvidia-ml-py, the [gpu] extra)

        pynvml.nvmlInit()
        stats = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            stats[i] = {"utilization_pct": int(pynvml.nvmlDeviceGetUtilizationRates(h).gpu),
                        "used_bytes": int(mem.used), "total_bytes": int(mem.total)}
        return stats
    except Exception:  # noqa: BLE001 - ImportError or NVMLError: no live numbers
        return None
