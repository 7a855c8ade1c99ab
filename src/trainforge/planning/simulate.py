"""Simulate one training step of a model on one GPU (or one rank) without a GPU and without memory.

    sim = simulate_step(cfg.model, cfg.optim, info, micro_batch_size=8, precision="bf16")
    sim.peak_bytes, sim.breakdown["activations"], sim.model_flops_per_sample

Method. The real model (`build_model`, on the meta device, then given fake CPU tensors:
`planning.fake_model`) and optimizer (`build_optimizer`) are built under `FakeTensorMode`: tensors
carry shapes, dtypes and devices but no storage, so a 7B model costs no memory. Two training
iterations run as the trainer runs them (forward under autocast, the task's loss on the float output,
backward, optimizer step, zero_grad) inside torch's `MemTracker` (`PeakMemTracker`: the global
peak only), which sees every tensor created and freed and files it under parameters, gradients,
optimizer state, activations or backward temporaries. The second iteration's forward and backward
is the first one's with the optimizer state alive, so it is added, not run again
(`_replayed_iterations`); both optimizer steps run. The larger of the two phases' peaks, forward +
backward and optimizer step (`phase_peak_bytes`), is the simulated peak; `measure_real_step` runs
both iterations in full on real CPU tensors and is what tests compare against (equal to the byte).
FSDP runs the same way on a fake process group (one rank of `world_size`, no communication) with
`FSDPMemTracker`. FLOPs are counted on the same fake model (`planning.flops`), or passed in
(`step_flops_per_sample`: the same for every micro-batch, strategy and world size).

Blind spots, by design left to the caller's calibrated correction terms: the CUDA context,
cuBLAS/cuDNN workspaces, the caching allocator's rounding and fragmentation, NCCL and DDP
communication buffers, torch.compile, and GPU-only kernel choices (fused optimizers allocate no
per-parameter temporaries; the CPU for-loop optimizer simulated here holds about two of the
largest parameter's size during the step; CPU autocast casts a few ops differently from CUDA's).
Gradient clipping and fp16 loss scaling are not simulated (in-place, a few scalars).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from trainforge.config import ModelConfig, OptimConfig
from trainforge.data.base import DataInfo
from trainforge.engine.parallelize import apply_activation_checkpointing, apply_fsdp
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.planning.fake_model import build_fake_model
from trainforge.planning.flops import count_flops
from trainforge.engine.optim import build_optimizer, freeze
from trainforge.engine.precision import DTYPES, autocast
from trainforge.tasks import Task, task_of
from trainforge.tasks.batch import batch_device, leaves

if TYPE_CHECKING:  # imported where a simulation starts (`_measure`, `_process_group`): about 1.8 s together
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import DeviceMesh

STRATEGIES = ("none", "ddp", "fsdp")

# MemTracker / FSDPMemTracker categories -> our breakdown keys; anything else goes to "other"
# (the input batch, FSDP all-gather and reduce-scatter buffers, untracked externals).
CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "parameters",  # BatchNorm running statistics: model state like the weights
    "Sharded Param": "parameters",
    "Unsharded Param": "parameters",
    "Gradient": "gradients",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Optstate": "optimizer_state",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
}
BREAKDOWN_KEYS = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")

# HBM traffic of activations per step relative to what forward saves: written in forward, read
# back in backward, and their gradients written and read once more (~2-3x; we take 3).
ACTIVATION_TRAFFIC_FACTOR = 3

DDP_NOTE = (
    "ddp: simulated as one full model replica per rank; DDP adds gradient buckets (25 MiB each by "
    "default, together another grad_bytes unless gradient_as_bucket_view) and NCCL buffers: add them "
    "as correction terms"
)
FSDP_NOTE = (
    "fsdp: optimizer step simulated one parameter at a time (foreach=False); its temporaries, about twice "
    "the largest local shard, are in the peak. A fused step (trainforge's default on GPUs) needs none, "
    "a foreach step about one more copy of the local parameters; all-gather/reduce-scatter buffers are "
    "under 'other'"
)


@dataclass
class Simulation:
    """One simulated training step on one rank; bytes are per rank, FLOPs per sample."""

    micro_batch_size: int
    world_size: int
    strategy: str  # none | ddp | fsdp
    activation_checkpointing: bool
    precision: str  # fp32 | bf16 | fp16
    peak_bytes: int  # per rank, from the tracker, no correction terms
    breakdown: dict[str, int]  # at the peak, BREAKDOWN_KEYS (+ "other"); sums to peak_bytes
    param_count: int
    param_bytes: int  # per rank (sharded under fsdp)
    grad_bytes: int  # full gradient bytes (trainable parameters) before sharding: what DDP all-reduces
    model_flops_per_sample: float  # forward + backward, no recompute
    hardware_flops_per_sample: float  # including activation recompute
    tokens_per_sample: int  # seq_len for token inputs, else 1
    # rough HBM bytes moved per sample: ACTIVATION_TRAFFIC_FACTOR x activation_bytes / micro-batch,
    # plus one step's weight, gradient and optimizer-state reads and writes spread over the micro-batch
    memory_traffic_bytes_per_sample: float
    activation_bytes: int = 0  # saved by forward for backward at the end of forward, per micro-batch
    optimizer_state_bytes: int = 0  # per rank, persistent between steps
    # the peak of each phase of the step, "forward_backward" (the second iteration's) and "optimizer_step";
    # peak_bytes is the larger. The moment holding the peak can change with the micro-batch (planning.memory)
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def simulate_step(
    model_cfg: ModelConfig,
    optim_cfg: OptimConfig,
    info: DataInfo,
    *,
    micro_batch_size: int,
    precision: str = "fp32",
    strategy: str = "none",
    world_size: int = 1,
    activation_checkpointing: bool = False,
    label_smoothing: float = 0.0,
    freeze_patterns: Sequence[str] = (),
    flops_per_sample: Optional[tuple[float, float]] = None,
) -> Simulation:
    """Simulate two training iterations of `model_cfg` on fake tensors; see the module docstring.

    `strategy` "ddp" simulates one full replica (what each rank holds); "fsdp" one rank of
    `world_size` with each repeated block and the root sharded (FSDP2). `freeze_patterns` (`train.freeze`)
    are frozen as training freezes them: no gradients, no optimizer state. Callable repeatedly.
    `flops_per_sample`: (model, hardware) FLOPs per sample from `step_flops_per_sample` with the same
    checkpointing, precision and freezing, when the caller has them (they do not depend on the micro-batch,
    the strategy or the world size); counted here otherwise.
    """
    _check(micro_batch_size, precision, strategy, world_size)
    # the device mesh reads its rank table, so it is made before fake mode starts
    with _process_group(strategy, world_size) as mesh, FakeTensorMode():
        model, spec = build_fake_model(model_cfg, info)
        param_count, full_param_bytes = _param_stats(model)
        _prepare(model, activation_checkpointing, freeze_patterns)
        grad_bytes = _param_stats(model)[1]  # the trainable parameters: frozen ones are buffers by now
        task = task_of(info)
        batch = task.example_batch(info, spec.example(micro_batch_size), micro_batch_size)
        if flops_per_sample is None:
            flops_per_sample = _per_sample(count_flops(model, batch, task=task, precision=precision), micro_batch_size)
        measured = _measure(model, optim_cfg, batch, task, precision, label_smoothing, mesh, replay=True)

    notes = {"ddp": [DDP_NOTE], "fsdp": [FSDP_NOTE]}.get(strategy, [])
    param_bytes = measured.param_bytes
    state_traffic = (
        2 * full_param_bytes  # weights read in forward and in backward
        + 2 * (param_bytes + measured.optimizer_state_bytes)  # optimizer reads and writes weights and state
        + 2 * param_bytes  # gradients written in backward and read by the optimizer (local shard)
    )
    traffic = ACTIVATION_TRAFFIC_FACTOR * measured.activation_bytes + state_traffic
    return Simulation(
        micro_batch_size=micro_batch_size,
        world_size=world_size,
        strategy=strategy,
        activation_checkpointing=activation_checkpointing,
        precision=precision,
        peak_bytes=measured.peak_bytes,
        breakdown=measured.breakdown,
        param_count=param_count,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,  # gradients have their parameters' (master) dtype; frozen weights have none
        model_flops_per_sample=flops_per_sample[0],
        hardware_flops_per_sample=flops_per_sample[1],
        tokens_per_sample=_tokens_per_sample(info),
        memory_traffic_bytes_per_sample=traffic / micro_batch_size,
        activation_bytes=measured.activation_bytes,
        optimizer_state_bytes=measured.optimizer_state_bytes,
        phase_peak_bytes=measured.phase_peak_bytes,
        notes=notes,
    )


def step_flops_per_sample(
    model_cfg: ModelConfig,
    info: DataInfo,
    *,
    precision: str = "fp32",
    activation_checkpointing: bool = False,
    freeze_patterns: Sequence[str] = (),
    micro_batch_size: int = 1,
) -> tuple[float, float]:
    """(model, hardware) FLOPs per sample of one forward + backward, counted on a fake model (`planning.flops`).

    The counted ops (matmuls, convolutions, attention) are linear in the micro-batch and run before any
    sharding, so one count serves every micro-batch, strategy and world size of a checkpointing setting;
    `simulate_step(..., flops_per_sample=...)` takes it instead of counting again.
    """
    with FakeTensorMode():
        model, spec = build_fake_model(model_cfg, info)
        _prepare(model, activation_checkpointing, freeze_patterns)
        task = task_of(info)
        batch = task.example_batch(info, spec.example(micro_batch_size), micro_batch_size)
        flops = count_flops(model, batch, task=task, precision=precision)
    return _per_sample(flops, micro_batch_size)


def measure_real_step(
    model_cfg: ModelConfig,
    optim_cfg: OptimConfig,
    info: DataInfo,
    *,
    micro_batch_size: int,
    precision: str = "fp32",
    strategy: str = "none",
    world_size: int = 1,
    activation_checkpointing: bool = False,
    label_smoothing: float = 0.0,
    device: str = "cpu",
) -> int:
    """Peak bytes of the same two iterations on REAL tensors on `device`: the simulator's ground truth.

    Allocates the memory for real, so use it on models that fit the machine.
    """
    _check(micro_batch_size, precision, strategy, world_size)
    target = torch.device(device)
    with _process_group(strategy, world_size) as mesh, target:
        model, spec = build_model(model_cfg, info)
        if activation_checkpointing:
            apply_activation_checkpointing(model)
        task = task_of(info)
        batch = task.example_batch(info, spec.example(micro_batch_size, device=target), micro_batch_size)
        return _measure(model, optim_cfg, batch, task, precision, label_smoothing, mesh, replay=False).peak_bytes


# ---------------------------------------------------------------- the tracked iterations


@dataclass
class _Measured:
    peak_bytes: int
    breakdown: dict[str, int]
    param_bytes: int
    activation_bytes: int
    optimizer_state_bytes: int
    phase_peak_bytes: dict[str, int] = field(default_factory=dict)


def _measure(
    model: nn.Module,
    optim_cfg: OptimConfig,
    batch: Any,
    task: Task,
    precision: str,
    label_smoothing: float,
    mesh: Optional[DeviceMesh],
    *,
    replay: bool,
) -> _Measured:
    """Build the optimizer (sharding the model first when a mesh is given) and track two iterations, the second
    one's forward and backward replayed (`_replayed_iterations`) or run (`_two_iterations`)."""
    # heavy (about 1.1 s: torch's memory trackers and DTensor's ops): a training run that plans nothing skips them
    from trainforge.planning.trackers import PeakFSDPMemTracker, PeakMemTracker

    if mesh is None:
        optimizer = build_optimizer(model, optim_cfg)
        tracker = PeakMemTracker()
        tracker.track_external(model, optimizer, *leaves(batch))
    else:
        apply_fsdp(model, mesh, param_dtype=None if precision == "fp32" else DTYPES[precision])
        optimizer = build_optimizer(model, optim_cfg)
        for group in optimizer.param_groups:
            # fused/foreach steps on fake DTensors inflate the tracked peak many times over
            group["foreach"] = False
        tracker = PeakFSDPMemTracker(model, optimizer)
        tracker.track_inputs(tuple(leaves(batch)))
    iterations = _replayed_iterations if replay else _two_iterations
    return iterations(tracker, model, optimizer, batch, task, precision, label_smoothing)


def _two_iterations(
    tracker: MemTracker,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    task: Task,
    precision: str,
    label_smoothing: float,
) -> _Measured:
    """Two steps as the trainer takes them; the second starts with the optimizer state in place."""
    with tracker:
        for i in range(2):
            activation_bytes = _forward_backward(tracker, model, batch, task, precision, label_smoothing)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if i == 0:
                tracker.reset_mod_stats()
        after = _categories(_one_device(tracker.get_tracker_snapshot("current")))
    peak_snapshot = _one_device(tracker.get_tracker_snapshot("peak"))
    return _Measured(
        peak_bytes=peak_snapshot["Total"],
        breakdown=_breakdown(peak_snapshot),
        param_bytes=_local_param_bytes(model),
        activation_bytes=activation_bytes,
        optimizer_state_bytes=after["optimizer_state"],
    )


def _replayed_iterations(
    tracker: MemTracker,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Any,
    task: Task,
    precision: str,
    label_smoothing: float,
) -> _Measured:
    """The same two iterations as `_two_iterations` with one forward + backward instead of two.

    The second iteration's forward and backward allocate and free what the first one's did, with the optimizer
    state (made by the first step, the same size from then on) alive throughout: its peak is the first one's
    plus that state, and is computed so rather than run again (a third of a simulation). Both optimizer steps
    run, the second on the first one's gradients (fake tensors have shapes, not values), and the step's peak
    is the second one's: it holds the whole state from its start, the first only what it has made so far.
    (Under FSDP the first step also fills DTensor's sharding-propagation cache, whose fake runs of each op
    the tracker files as optimizer state: the first FSDP step of a process would read high.)
    `tests/planning/test_simulate.py` checks the result against two real iterations on real tensors.
    """
    with tracker:
        activation_bytes = _forward_backward(tracker, model, batch, task, precision, label_smoothing)
        forward_backward = _breakdown(_one_device(tracker.get_tracker_snapshot("peak")))
        optimizer.step()
        tracker.reset_peak()
        optimizer.step()  # the second iteration's
        optimizer.zero_grad(set_to_none=True)
        state_bytes = _categories(_one_device(tracker.get_tracker_snapshot("current")))["optimizer_state"]
    phases = {
        "forward_backward": {**forward_backward, "optimizer_state": forward_backward["optimizer_state"] + state_bytes},
        "optimizer_step": _breakdown(_one_device(tracker.get_tracker_snapshot("peak"))),
    }
    peak = max(phases.values(), key=lambda breakdown: sum(breakdown.values()))
    return _Measured(
        peak_bytes=sum(peak.values()),
        breakdown=_reported(peak),
        param_bytes=_local_param_bytes(model),
        activation_bytes=activation_bytes,
        optimizer_state_bytes=state_bytes,
        phase_peak_bytes={name: sum(breakdown.values()) for name, breakdown in phases.items()},
    )


def _forward_backward(
    tracker: MemTracker,
    model: nn.Module,
    batch: Any,
    task: Task,
    precision: str,
    label_smoothing: float,
) -> int:
    """Forward, loss, backward in a function of its own, as in the trainer: logits die before the step.

    Returns the activation bytes alive at the end of forward (what backward will read).
    """
    with autocast(batch_device(batch), precision):
        output = task.forward(model, batch)
    loss = task.training_loss(output, batch, label_smoothing=label_smoothing)
    del output  # as the trainer does: backward does not need it
    activation_bytes = _categories(_one_device(tracker.get_tracker_snapshot("current")))["activations"]
    loss.backward()
    return activation_bytes


# ---------------------------------------------------------------- helpers


def _check(micro_batch_size: int, precision: str, strategy: str, world_size: int) -> None:
    if micro_batch_size < 1:
        raise UserError(f"train.micro_batch_size: must be a positive integer, got {micro_batch_size}")
    if precision not in DTYPES:
        raise UserError(
            f"train.precision: the simulator needs one of {', '.join(DTYPES)}, got {precision!r}; "
            "resolve 'auto' for the target device first"
        )
    if strategy not in STRATEGIES:
        raise UserError(f"distributed.strategy: the simulator needs one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if world_size < 1 or (strategy == "none" and world_size != 1):
        raise UserError(
            f"world_size: {world_size} does not fit distributed.strategy {strategy!r}; "
            "use 1 with 'none', any positive number with 'ddp' or 'fsdp'"
        )


@contextlib.contextmanager
def _process_group(strategy: str, world_size: int) -> Iterator[Optional[DeviceMesh]]:
    """For fsdp: rank 0 of a fake `world_size` process group (no communication) and its CPU mesh.

    Torn down on exit so the simulator can be called again in the same process.
    """
    if strategy != "fsdp":
        yield None
        return
    if dist.is_initialized():
        raise RuntimeError("simulating fsdp needs its own fake process group; torch.distributed is already initialized")
    from torch.distributed.device_mesh import init_device_mesh  # heavy (DTensor's ops): only an fsdp simulation

    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))
    finally:
        dist.destroy_process_group()


def _prepare(model: nn.Module, activation_checkpointing: bool, freeze_patterns: Sequence[str]) -> None:
    """Freeze and checkpoint as training does, in its order (after the parameters were counted)."""
    if freeze_patterns:
        freeze(model, freeze_patterns)  # as training does: same patterns, same errors
    _frozen_as_buffers(model)  # frozen by train.freeze, or by the model itself (a LoRA run's base)
    if activation_checkpointing:
        apply_activation_checkpointing(model)


def _per_sample(flops: tuple[float, float], micro_batch_size: int) -> tuple[float, float]:
    return flops[0] / micro_batch_size, flops[1] / micro_batch_size


def _tokens_per_sample(info: DataInfo) -> int:
    return task_of(info).tokens_per_sample(info)


def _param_stats(model: nn.Module) -> tuple[int, int]:
    """(count, bytes) of the unsharded parameters, each shared tensor once."""
    params = list(model.parameters())  # parameters() already yields a tied tensor once
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def _local_param_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds: its shards under FSDP, everything otherwise."""
    from torch.distributed.tensor import DTensor  # loaded already: the simulation that called this imported it

    total = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def _one_device(snapshot: dict) -> dict[str, int]:
    devices = list(snapshot.values())
    assert len(devices) == 1, f"expected tensors on one device, got {list(snapshot)}"
    return devices[0]


def _categories(device_snapshot: dict[str, int]) -> dict[str, int]:
    out = dict.fromkeys(BREAKDOWN_KEYS, 0)
    for name, nbytes in device_snapshot.items():
        if name != "Total":
            key = CATEGORIES.get(str(getattr(name, "value", name)), "other")
            out[key] = out.get(key, 0) + nbytes
    return out


def _breakdown(device_snapshot: dict[str, int]) -> dict[str, int]:
    out = _categories(device_snapshot)
    assert sum(out.values()) == device_snapshot["Total"], (out, device_snapshot)
    return _reported(out)


def _reported(categories: dict[str, int]) -> dict[str, int]:
    """BREAKDOWN_KEYS, and "other" only when something is filed there."""
    return {k: v for k, v in categories.items() if k != "other" or v}


def _frozen_as_buffers(model: nn.Module) -> None:
    """Hold each frozen parameter as a buffer: MemTracker installs a gradient hook on every parameter and fails
    on one without gradient. A frozen weight costs what a buffer costs (memory, no gradient, no optimizer
    state), so the peak is the same; the breakdown counts it under buffers."""
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if not param.requires_grad:
                delattr(module, name)
                module.register_buffer(name, param.detach(), persistent=False)
