"""Resolve, then run: the concrete values a run uses, decided once, each with the reason it is what it is.

    setup = resolve(cfg, env, device, facts)                                # a fresh run
    setup = resolve(cfg, env, device, facts, checkpoint=state)              # resuming from a checkpoint's state
    setup = resolve(cfg, env, device, facts, oom=OOMNote(32, step=120))     # after running out of memory
    setup.micro_batch_size, setup.accumulation, setup.precision, setup.strategy, ...
    setup.reasons     # {"micro_batch_size": "auto: 48, predicted peak ...", ...}: every value not taken verbatim

Every `auto`, every default that depends on the machine, the world size, a checkpoint or an out-of-memory
restart becomes a value here and nowhere else. `fit()` receives a `RunSetup` and only runs it; when a step
runs out of memory, the loop asks this function again (with an `OOMNote`) for the smaller setup. The job
admission resolves a submission here too (with the budget of the server's largest slot), and calibration
measures the run that this function set up. `trainforge plan`, which searches over GPUs rather than running
on one, uses the same precision rule (`engine.precision.resolve_precision`) and batch geometry
(`engine.microbatch`) for every candidate.

Precedence for the micro-batch: an out-of-memory note (the failed size shrunk to the largest divisor of the
rank's share that is at most half) > the checkpoint's (a resumed run never grows past what it last ran, nor
past the config's) > the config's integer (an upper bound fitted to the rank's share) > `auto` (the largest
whose simulated step fits the memory budget; `planning.auto`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

import torch

from trainforge.config import Config, EarlyStoppingConfig, OptimConfig, ScheduleConfig
from trainforge.data.stages.loader import resolve_num_workers, run_steps, steps_per_epoch
from trainforge.engine.env import DistEnv, resolve_strategy
from trainforge.hardware.device import supports_bf16
from trainforge.planning.auto import (MemoryBudget, auto_micro_batch, device_budget, memory_factor, memory_terms,
                                      predicted_peak_bytes)
from trainforge.planning.memory import sim_key
from trainforge.planning.plan import Planner
from trainforge.engine.microbatch import batch_geometry, largest_divisor_at_most, per_rank_batch, shrink_micro_batch
from trainforge.engine.precision import resolve_precision
from trainforge.tasks import task_of
from trainforge.engine.preflight import DataFacts  # noqa: F401  (the resolver's input, built by the pre-flight)


@dataclass(frozen=True)
class LoopSettings:
    """The config the loop runs with besides the geometry: its slices (optimizer, schedule) and the train and log
    knobs it reads, taken from the config once, here, so the loop reads no config."""

    seed: int
    config_yaml: str  # the resolved config, recorded in every checkpoint
    optim: OptimConfig
    schedule: ScheduleConfig
    early_stopping: Optional[EarlyStoppingConfig]
    ema_decay: Optional[float]
    label_smoothing: float
    loss: Optional[str]  # train.loss: the task's named loss, None for its default
    grad_clip_norm: Optional[float]
    log_every_steps: int
    max_bad_steps: int
    keep_checkpoints: int
    tensorboard: bool
    progress: bool
    report: bool

    @classmethod
    def of(cls, cfg: Config) -> "LoopSettings":
        tc = cfg.train
        return cls(seed=cfg.seed, config_yaml=cfg.to_yaml(), optim=cfg.optim, schedule=cfg.schedule, early_stopping=tc.early_stopping,
                   ema_decay=tc.ema_decay, label_smoothing=tc.label_smoothing, loss=tc.loss, grad_clip_norm=tc.grad_clip_norm,
                   log_every_steps=tc.log_every_steps, max_bad_steps=tc.max_bad_steps,
                   keep_checkpoints=tc.keep_checkpoints, tensorboard=cfg.log.tensorboard, progress=cfg.log.progress,
                   report=cfg.log.report)


@dataclass(frozen=True)
class OOMNote:
    """A step ran out of memory with `micro_batch_size` (in this process, or before the group restarted)."""

    micro_batch_size: int
    step: int  # 1-based: the step that failed
    restarted: bool = False  # the note survived a restart of the whole group (FSDP, DDP's backward)


@dataclass(frozen=True)
class RunSetup:
    env: DistEnv
    device: torch.device
    precision: str  # fp32 | bf16 | fp16
    strategy: str  # none | ddp | fsdp
    global_batch_size: int
    micro_batch_size: int
    accumulation: int  # micro-batches per optimizer step on each rank
    steps_per_epoch: int
    total_steps: int
    eval_every_steps: int
    checkpoint_every_steps: int
    channels_last: bool
    num_workers: int
    pin_memory: bool
    compile: bool
    activation_checkpointing: bool
    predicted_peak_bytes: Optional[int] = None  # when the planner was asked (auto, or predict=True)
    class_weights: Optional[tuple[float, ...]] = None  # train.class_weights resolved: one per class, in class order
    reasons: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    loop: Optional[LoopSettings] = None  # what else the loop reads (always set by `resolve`)

    notes: tuple[str, ...] = ()  # said once at the start: changes to what the config asked for explicitly

    @property
    def world_size(self) -> int:
        return self.env.world_size

    def to_json(self) -> dict[str, Any]:
        """The setup as final/model.json records it (`ran`)."""
        return {
            "device": str(self.device), "precision": self.precision, "strategy": self.strategy,
            "world_size": self.world_size, "micro_batch_size": self.micro_batch_size,
            "accumulation": self.accumulation, "channels_last": self.channels_last, "num_workers": self.num_workers,
            "compile": self.compile, "predicted_peak_bytes": self.predicted_peak_bytes,
            "class_weights": None if self.class_weights is None else list(self.class_weights),
            "reasons": dict(self.reasons),
        }


def resolve(
    cfg: Config,
    env: DistEnv,
    device: torch.device,
    facts: DataFacts,
    *,
    checkpoint: Optional[Mapping[str, Any]] = None,
    oom: Optional[OOMNote] = None,
    budget: Optional[MemoryBudget] = None,
    bf16_supported: Optional[bool] = None,
    predict: bool = False,
) -> RunSetup:
    """The run's concrete setup. `checkpoint`: the state of the checkpoint being resumed (its micro-batch);
    `oom`: the micro-batch that ran out of memory; `budget`: the memory `auto` may plan for (default: this
    device's, `planning.auto.device_budget`); `bf16_supported`: for a device this process does not hold (the
    job admission); `predict`: also predict the peak at a micro-batch the config fixed (the admission reserves it).

    UserError (one line) for a geometry or strategy that cannot run, or an `auto` that finds nothing fitting."""
    tc = cfg.train
    reasons: dict[str, str] = {}
    if tc.device == "auto":
        reasons["device"] = f"auto: {device}" + ("" if device.type != "cpu" else " (no accelerator found)")
    bf16 = supports_bf16(device) if bf16_supported is None else bf16_supported
    precision, why = resolve_precision(tc.precision, device.type, bf16)
    _note(reasons, "precision", why)
    strategy, why = resolve_strategy(cfg.distributed.strategy, env)
    _note(reasons, "strategy", why)

    global_batch = tc.global_batch_size
    per_rank = per_rank_batch(global_batch, env.world_size)
    per_epoch = steps_per_epoch(facts.train_samples, global_batch)
    total_steps = run_steps(tc, facts.train_samples)
    micro, why = _micro_batch(tc.micro_batch_size, per_rank, env.world_size, checkpoint, oom)
    peak = None
    refusal = task_of(facts.info).simulation_refusal
    if refusal is not None and micro is None:  # a step the planner cannot simulate: the batch, and OOM recovery
        micro = per_rank
        why = (f"train.micro_batch_size auto: {micro}, the whole per-process batch (not simulated: {refusal}); "
               "out-of-memory recovery halves it where it does not fit")
    elif refusal is None and (micro is None or predict):  # the planner: auto, or a prediction at the size fixed above
        key = sim_key(strategy, env.world_size, cfg.train.activation_checkpointing, precision)
        budget = budget or device_budget(tc.memory_budget_bytes, device)
        terms = memory_terms(device.type, env.world_size, facts.convolutional, budget)
        factor = memory_factor(device) if budget.context_counted else None  # a calibration is of this device
        planner = Planner(cfg, info=facts.info, steps=total_steps, model=facts.model)  # the pre-flight's model facts
        if micro is None:
            choice = auto_micro_batch(planner, key, per_device=per_rank, budget=budget, terms=terms, factor=factor)
            micro, peak = choice.micro_batch_size, choice.predicted_peak_bytes
            why = (f"train.micro_batch_size auto: {micro} (predicted peak {peak / 2**20:.0f} MiB of "
                   f"{budget.budget_bytes / 2**20:.0f} MiB, {budget.source})")
        else:
            peak = predicted_peak_bytes(planner, key, micro, terms, factor)
    _note(reasons, "micro_batch_size", why)

    channels_last = tc.channels_last is True or (tc.channels_last == "auto" and device.type == "cuda"
                                                 and facts.convolutional)
    if tc.channels_last == "auto":
        reasons["channels_last"] = (f"auto: {'on' if channels_last else 'off'} "
                                    f"({'a CNN on CUDA' if channels_last else 'only CNNs on CUDA use it'})")
    workers = resolve_num_workers(cfg.data.num_workers, device.type)
    if cfg.data.num_workers == "auto":
        reasons["num_workers"] = f"auto: {workers} on {device.type}"
    class_weights = None
    if tc.class_weights is not None:
        class_weights, reasons["class_weights"] = resolve_class_weights(tc.class_weights, facts)
    explicit = {"micro_batch_size": True, "precision": tc.precision != "auto",
                "strategy": cfg.distributed.strategy != "auto"}
    notes = tuple(reasons[k] for k, said in explicit.items() if said and k in reasons)
    return RunSetup(
        env=env, device=device, precision=precision, strategy=strategy, global_batch_size=global_batch,
        micro_batch_size=micro, accumulation=per_rank // micro, steps_per_epoch=per_epoch, total_steps=total_steps,
        eval_every_steps=tc.eval_every_steps or per_epoch, checkpoint_every_steps=tc.checkpoint_every_steps or per_epoch,
        channels_last=channels_last, num_workers=workers, pin_memory=device.type == "cuda", compile=tc.compile,
        activation_checkpointing=cfg.train.activation_checkpointing, predicted_peak_bytes=peak,
        class_weights=class_weights, reasons=MappingProxyType(reasons), notes=notes, loop=LoopSettings.of(cfg),
    )


def resolve_class_weights(requested: Any, facts: DataFacts) -> tuple[tuple[float, ...], str]:
    """(one weight per class, why). auto: n / (classes x count) over the train split (scikit-learn's "balanced"); a
    class the train split lacks weighs 0 (no sample of it is ever weighed)."""
    counts = facts.train_class_counts or ()
    names = facts.info.class_names
    if requested == "auto":
        n, k = sum(counts), len(counts)
        weights = tuple(round(n / (k * c), 6) if c else 0.0 for c in counts)
        shown = ", ".join(f"{name} {w:g} ({c})" for name, w, c in list(zip(names, weights, counts))[:10])
        return weights, f"auto: n / (classes x count) over the train split's {n} samples: {shown}"
    return tuple(float(w) for w in requested), "as set: " + ", ".join(
        f"{name} {w:g}" for name, w in list(zip(names, requested))[:10])


def _micro_batch(requested, per_rank: int, world_size: int, checkpoint: Optional[Mapping[str, Any]],
                 oom: Optional[OOMNote]) -> tuple[Optional[int], Optional[str]]:
    """(micro-batch, why) by precedence; (None, None) when `auto` must ask the planner."""
    if oom is not None:  # JobFailed when it is 1 already
        micro = shrink_micro_batch(oom.micro_batch_size, per_rank)
        when = "before the group restarted" if oom.restarted else "in this run"
        return micro, (f"out of memory at step {oom.step} with micro-batch {oom.micro_batch_size} ({when}): "
                       f"micro-batch -> {micro}, accumulation -> {per_rank // micro}")
    if checkpoint is not None:
        saved = int(checkpoint["micro_batch_size"])
        wanted = saved if requested == "auto" else min(requested, saved)
        micro = largest_divisor_at_most(per_rank, wanted)
        if micro == requested:
            return micro, None
        return micro, (f"train.micro_batch_size {requested} -> {micro}: the checkpoint of step {checkpoint['step']} "
                       f"ran {saved}, fitted to {per_rank} samples per process")
    if isinstance(requested, int):
        geometry = batch_geometry(per_rank * world_size, requested, world_size)
        return geometry.micro_batch_size, geometry.note
    return None, None


def _note(reasons: dict[str, str], key: str, why: Optional[str]) -> None:
    if why:
        reasons[key] = why
