"""`trainforge plan`: memory, time, cost and energy of a recipe on candidate GPUs, and a recommended setup.

    result = plan(cfg, gpus=["h100-sxm", "rtx-4090"], num_gpus=[1, 2, 4, 8], budget_usd=500)  # -> Plan
    result.simulation       # the recipe's own step, simulated: peak bytes, breakdown, FLOPs per step
    result.candidates       # one Candidate per GPU type x count: fits?, strategy, micro-batch, time, cost, energy
    result.recommendation   # fastest, cheapest, and the pick within budget and deadline
    result.to_json()        # the `plan --json` document (planning.result)

Each candidate is three small steps: `fit_memory` (strategy and micro-batch), `time_step` (roofline step
time), `price_run` (total time, cost, energy against budget and deadline); `Planner.candidate` chains them.

For each GPU type and count the strategies are tried in order — DDP (one GPU: plain) when the whole
model fits, else FSDP, else FSDP (or plain) with activation checkpointing — and the largest micro-batch
that fits with a 10% margin is taken, accumulation keeping the global batch. Memory comes from the
fake-tensor simulation (`planning.simulate`) plus the correction terms of `planning.corrections`;
time from the roofline of `planning.roofline`. Simulations are shared by every GPU (docs/planner.md).

A fine-tuning recipe (`model.lora`) is planned for three methods side by side (`method_planners`): `full` (the
same model without adapters), `lora` (the base frozen in its dtype) and `qlora` (the base's block Linear weights
stored in NF4); candidates say which (`Candidate.method`) and the recommendation picks among all of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence, Union

import torch
from torch import nn

from trainforge.config import Config
from trainforge.data.base import DataInfo
from trainforge.data.stages.loader import run_steps
from trainforge.errors import UserError
from trainforge.hardware.catalog import Catalog, GPUSpec, Price, load_catalog
from trainforge.hardware.device import resolve_device
from trainforge.models import build_model, is_convolutional
from trainforge.models.quantize_base import base_bytes_per_param
from trainforge.planning.calibration_store import load_calibration
from trainforge.planning.corrections import Term, applicable, corrected_peak_bytes
from trainforge.planning.kernels import kernels_per_micro_batch
from trainforge.planning.local import local_spec, spec_for
from trainforge.planning.memory import (SAFETY_MARGIN, BaseQuantization, LinearPeak, SimCache, SimKey, fit_linear,
                                        largest_fitting, memory_class, quantized_base, sim_key)
from trainforge.planning.result import Candidate, Plan, Recommendation, StepSimulation
from trainforge.planning.roofline import (Efficiency, StepTime, default_efficiency, dequantize_time_s, run_totals,
                                          step_time)
from trainforge.planning.simulate import Simulation, simulate_step
from trainforge.tasks import task_of
from trainforge.engine.microbatch import batch_geometry
from trainforge.engine.optim import freeze
from trainforge.engine.precision import resolve_precision
from trainforge.engine.preflight import ModelFacts, describe_model, preflight  # noqa: F401  (ModelFacts: here too)

DEFAULT_NUM_GPUS = (1, 2, 4, 8)
HOPPER_OR_NEWER = ("h100", "h200", "b200", "gh200")


class Planner:
    """Everything about one recipe that does not depend on the GPU: data facts, step count, the shared
    simulation cache and kernel counts. `candidate(spec, n)` prices one GPU type x count.

    A QLoRA recipe (`model.quantize_base`, or `quantize=` for the alternative of a LoRA recipe) is simulated as
    LoRA, its base in its dtype (fake tensors are not quantized), by `unquantized` (that LoRA recipe's planner,
    made here when not given): its cache holds those simulations corrected by `memory.quantized_base`."""

    def __init__(self, cfg: Config, info: Optional[DataInfo] = None, steps: Optional[int] = None, *,
                 model: Optional[ModelFacts] = None, quantize: Optional[str] = None,
                 unquantized: Optional["Planner"] = None) -> None:
        """`info`, `steps` and `model`: the pre-flight's facts of the run (`training.setup.resolve` passes its own);
        without `info`, the pre-flight runs here (shapes and sizes, nothing decoded, no weights)."""
        if info is None:
            pre = preflight(cfg, fit_stats=False, on_meta=True)
            info, model = pre.data.info, pre.facts.model
            steps = steps if steps is not None else run_steps(cfg.train, pre.facts.train_samples)
        assert steps is not None, "a planner given the data's facts is given the run's steps too"
        task = task_of(info)
        if task.simulation_refusal is not None:
            raise UserError(f"plan: {task.title} steps are not simulated yet: {task.simulation_refusal}; train with a "
                            "fixed train.micro_batch_size on one GPU of the kind to learn its memory")
        self.cfg, self.info, self.steps = cfg, info, steps
        kind = quantize or quantize_kind(cfg)
        self.method = "full" if cfg.model.lora is None else ("lora" if kind == "none" else "qlora")
        self._kernels: dict[str, int] = {}
        self._flops: dict[tuple[bool, str], tuple[float, float]] = {}
        self.quantization: Optional[BaseQuantization] = None
        self.unquantized: Optional[Planner] = None
        if self.method != "qlora":
            self.facts = model if model is not None else model_facts(cfg, info)
            self.cache = SimCache(self._simulate)
            return
        base = unquantized or Planner(with_model(cfg, quantize_base="none"), info, steps)
        q = base_quantization(base.facts, kind)
        self.unquantized, self.quantization = base, q
        self.facts = replace(base.facts, frozen_bytes=base.facts.frozen_bytes - q.saved_bytes)
        self.cache = SimCache(lambda key, b: quantized_base(base.cache.get(key, b), q))

    def _simulate(self, key: SimKey, micro_batch_size: int) -> Simulation:
        """One simulation; FLOPs per sample are counted by the first of each checkpointing setting and
        precision class and reused by the others (they do not depend on micro-batch, strategy or world size)."""
        cfg, counted = self.cfg, (key.activation_checkpointing, key.precision)
        sim = simulate_step(
            cfg.model, cfg.optim, self.info, micro_batch_size=micro_batch_size, precision=key.precision,
            strategy=key.strategy, world_size=key.world_size, activation_checkpointing=key.activation_checkpointing,
            label_smoothing=cfg.train.label_smoothing, freeze_patterns=cfg.train.freeze,
            flops_per_sample=self._flops.get(counted),
        )
        self._flops.setdefault(counted, (sim.model_flops_per_sample, sim.hardware_flops_per_sample))
        return sim

    def kernel_count(self, precision: str) -> int:
        if self.unquantized is not None:  # the dequantization kernels are in `dequantize_time_s`
            return self.unquantized.kernel_count(precision)
        counted = memory_class(precision)  # fp16 autocasts the same ops as bf16: the same kernels
        if counted not in self._kernels:
            self._kernels[counted] = kernels_per_micro_batch(self.cfg.model, self.info, 1, counted)
        return self._kernels[counted]

    def candidate(
        self,
        spec: GPUSpec,
        num_gpus: int,
        *,
        precision: str,
        price=None,
        calibration: Optional[dict[str, float]] = None,
        efficiency: Optional[float] = None,
        budget_usd: Optional[float] = None,
        deadline_h: Optional[float] = None,
        fixed_micro: Optional[int] = None,
        fixed_checkpointing: Optional[bool] = None,
        device_type: str = "cuda",
    ) -> Candidate:
        """Fit memory (strategy, micro-batch) → time the step (roofline) → price the run (cost, energy)."""
        calibration = calibration or {}
        global_batch = self.cfg.train.global_batch_size
        if global_batch % num_gpus:
            return Candidate(spec.name, num_gpus, precision, fits=False, method=self.method,
                             reason=f"global batch {global_batch} does not divide over {num_gpus} GPUs")
        per_gpu = global_batch // num_gpus
        rule = MemoryRule(spec.memory_bytes * SAFETY_MARGIN, tuple(applicable(device_type, num_gpus, self.facts.convolutional)),
                          calibration.get("memory_factor"))
        fit = fit_memory(num_gpus, per_gpu, self.cache, self.facts, rule, precision, fixed_micro, fixed_checkpointing)
        if isinstance(fit, str):
            return Candidate(spec.name, num_gpus, precision, fits=False, method=self.method, reason=fit)
        q = self.quantization
        dequantize_s = 0.0 if q is None else dequantize_time_s(
            q.elements, q.bytes_per_param, 4 if memory_class(precision) == "fp32" else 2,
            passes=3 if fit.activation_checkpointing else 2, bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s)
        timing = time_step(spec, fit, num_gpus=num_gpus, per_gpu=per_gpu, precision=precision,
                           efficiency=efficiency_for(efficiency, fit.sim, self.facts, spec, self.cfg.train.compile),
                           kernels_per_micro_batch=self.kernel_count(precision),
                           time_factor=calibration.get("time_factor"), extra_s_per_micro_batch=dequantize_s)
        cost = price_run(timing.step_time_s, steps=self.steps, num_gpus=num_gpus, tdp_watts=spec.tdp_watts,
                         price=price, budget_usd=budget_usd, deadline_h=deadline_h)
        return Candidate(
            spec.name, num_gpus, precision, fits=True, method=self.method,
            strategy=fit.strategy, activation_checkpointing=fit.activation_checkpointing,
            micro_batch_size=fit.micro_batch_size, accumulation=fit.accumulation,
            peak_bytes_per_gpu=fit.peak_bytes, simulated_peak_bytes_per_gpu=fit.simulated_peak_bytes,
            model_flops_per_sample=fit.sim.model_flops_per_sample,
            corrections_bytes=fit.corrections_bytes, memory_bytes=spec.memory_bytes,
            step_time_s=timing.step_time_s, step_time_range_s=timing.step_time_range_s,
            calibrated_time_factor=timing.calibrated_time_factor, bound=timing.bound,
            exposed_comm_s=timing.exposed_comm_s, efficiency=timing.efficiency.mid,
            efficiency_range=(timing.efficiency.low, timing.efficiency.high),
            efficiency_source=timing.efficiency.source,
            total_time_s=cost.total_time_s, cost_usd=cost.cost_usd, energy_kwh=cost.energy_kwh,
            price_usd_per_hour=cost.price_usd_per_hour, price_source=cost.price_source,
            within_budget=cost.within_budget, within_deadline=cost.within_deadline,
        )


def plan(
    cfg: Config,
    *,
    gpus: Optional[Sequence[str]] = None,
    num_gpus: Sequence[int] = DEFAULT_NUM_GPUS,
    budget_usd: Optional[float] = None,
    deadline_h: Optional[float] = None,
    efficiency: Optional[float] = None,
    catalog: Optional[Catalog] = None,
    calibration: Optional[dict[str, dict[str, float]]] = None,
) -> Plan:
    """The plan (`Plan.to_json()` is the `plan --json` document): simulate the recipe's step, price every
    GPU type x count, recommend."""
    catalog = catalog or load_catalog()
    specs = [spec_for(g, catalog) for g in gpus] if gpus else [catalog.get(n) for n in catalog.names()]
    counts = sorted(set(int(n) for n in num_gpus))
    if not counts or counts[0] < 1:
        raise UserError(f"--num-gpus: expected positive counts like 1,2,4,8, got {list(num_gpus)}")
    if efficiency is not None and not 0 < efficiency <= 1:
        raise UserError(f"--efficiency: expected a fraction in (0, 1], got {efficiency}")
    for flag, limit, unit in (("--budget-usd", budget_usd, "US dollars, e.g. 500"), ("--deadline-h", deadline_h,
                                                                                        "hours, e.g. 24")):
        if limit is not None and not (math.isfinite(limit) and limit > 0):  # nan compares false: it would limit nothing
            raise UserError(f"{flag}: expected a positive number of {unit}, got {limit}")
    calibration = load_calibration() if calibration is None else calibration
    planners = method_planners(cfg)
    planner = next(p for p in planners if p.cfg is cfg)  # the recipe's own method

    candidates = []
    for spec in specs:
        device_type = "cpu" if spec.name == "cpu" else "cuda"
        precision = spec_precision(cfg.train.precision, spec)
        for n in counts if device_type == "cuda" else [1]:
            for method in planners:
                candidates.append(method_candidate(
                    method, method is planner, spec, n, precision=precision,
                    price=None if device_type == "cpu" else catalog.price(spec.name),
                    calibration=calibration.get(spec.name, {}), efficiency=efficiency, budget_usd=budget_usd,
                    deadline_h=deadline_h, device_type=device_type,
                ))
    # after the candidates: they count every simulation run (a qlora planner's are its lora planner's, corrected)
    simulations_run = sum(len(p.cache.runs) for p in planners if p.quantization is None)
    return Plan(
        recipe=cfg.name,
        steps=planner.steps,
        global_batch_size=cfg.train.global_batch_size,
        simulation=own_step(planner, simulations_run),
        candidates=tuple(sorted(candidates, key=rank_key)),
        recommendation=recommend(candidates, budget_usd, deadline_h),
        methods={p.method: own_step(p, simulations_run) for p in planners} if len(planners) > 1 else None,
    )


def method_planners(cfg: Config) -> list[Planner]:
    """The recipe's planner; for a fine-tuning recipe (`model.lora`) the three methods', in the order full, lora,
    qlora: full is the same model without adapters (every weight trains), lora the adapters on the base in its
    dtype, qlora the adapters on the base with its block Linear weights in NF4 (the recipe's own kind when it
    quantizes). lora and qlora share their simulations: qlora's are lora's, corrected."""
    own = Planner(cfg)
    if own.method == "full":
        return [own]
    info, steps = own.info, own.steps
    full = Planner(with_model(cfg, lora=None, quantize_base="none"), info, steps)
    if own.method == "qlora":
        return [full, own.unquantized, own]
    return [full, own, Planner(cfg, info, steps, quantize="nf4", unquantized=own)]


def method_candidate(planner: Planner, own: bool, spec: GPUSpec, num_gpus: int, **kwargs) -> Candidate:
    """`planner.candidate`; a method other than the recipe's own that the recipe cannot run (its `optim.param_groups`
    name adapters a full fine-tuning lacks) is a candidate that does not fit, with the reason."""
    try:
        return planner.candidate(spec, num_gpus, **kwargs)
    except UserError as e:
        if own:
            raise
        return Candidate(spec.name, num_gpus, kwargs["precision"], fits=False, method=planner.method,
                         reason=f"{planner.method}: {e}")


def quantize_kind(cfg: Config) -> str:
    """`model.quantize_base` (nf4 | int8 | none) of a LoRA recipe; none without adapters."""
    if cfg.model.lora is None:
        return "none"
    return cfg.model.quantize_base


def with_model(cfg: Config, **changes) -> Config:
    """`cfg` with these `model` fields changed (e.g. quantize_base="none": the same LoRA recipe without QLoRA)."""
    return cfg.model_copy(update={"model": cfg.model.model_copy(update=changes)})


def base_quantization(facts: ModelFacts, kind: str) -> BaseQuantization:
    """What QLoRA's `kind` does to the base of `facts` (the bytes per parameter are `models.quantize_base`'s)."""
    elements, weight_bytes, largest = facts.block_linear
    dtype_bytes = weight_bytes / elements if elements else 4.0
    return BaseQuantization(kind, base_bytes_per_param(kind, dtype_bytes=dtype_bytes), elements, weight_bytes, largest)


def own_step(planner: Planner, simulations_run: Optional[int] = None) -> StepSimulation:
    """The recipe's own step as configured (its micro-batch and activation checkpointing, one device), from the
    shared simulations."""
    cfg, global_batch = planner.cfg, planner.cfg.train.global_batch_size
    micro = (batch_geometry(global_batch, cfg.train.micro_batch_size).micro_batch_size  # an upper bound, as in training
             if isinstance(cfg.train.micro_batch_size, int) else 1)
    precision = memory_class(own_precision(cfg))
    own = planner.cache.get(SimKey("none", 1, cfg.train.activation_checkpointing, precision), micro)
    return StepSimulation(
        micro_batch_size=micro,
        precision=precision,
        peak_bytes=own.peak_bytes,
        breakdown=own.breakdown,
        param_count=own.param_count,
        model_flops_per_step=own.model_flops_per_sample * global_batch,
        hardware_flops_per_step=own.hardware_flops_per_sample * global_batch,
        samples_per_step=global_batch,
        tokens_per_step=global_batch * own.tokens_per_sample,
        accumulation=global_batch // micro,
        simulations_run=len(planner.cache.runs) if simulations_run is None else simulations_run,
    )


def plan_local_step(
    cfg: Config, device, catalog: Catalog, *, micro_batch_size: int, precision: str, calibration: Optional[dict] = None,
    activation_checkpointing: Optional[bool] = None,
) -> Candidate:
    """The prediction for `cfg` on this machine's device (one device, no parallelism) with the micro-batch,
    precision and activation checkpointing a run resolved (`RunSetup`; None: the planner's own choice):
    calibration and `benchmarks/gpu_check.py` compare it with that run."""
    spec = local_spec(device, catalog)
    candidate = Planner(cfg).candidate(
        spec, 1, precision=precision,
        calibration=(calibration if calibration is not None else load_calibration()).get(spec.name, {}),
        fixed_micro=micro_batch_size, fixed_checkpointing=activation_checkpointing, device_type=device.type,
    )
    if not candidate.fits:
        raise UserError(f"{cfg.name}: micro-batch {micro_batch_size} does not fit this {spec.name}: {candidate.reason}")
    return candidate


def own_precision(cfg: Config) -> str:
    """The precision the recipe's own step runs at, resolved as training resolves it on the recipe's device: fp32
    for a CPU run (`auto` included), else as on a GPU with bf16 (the catalog's candidates are each resolved by
    `spec_precision`)."""
    device = resolve_device(cfg.train.device, present=False)
    return resolve_precision(cfg.train.precision, device.type, bf16_supported=True)[0]


def spec_precision(requested: str, spec: GPUSpec) -> str:
    """The precision a run of `requested` gets on `spec`, decided as training decides it (`auto` and `bf16`
    become fp16 on GPUs without bf16: V100, T4)."""
    device_type = "cpu" if spec.name == "cpu" else "cuda"
    return resolve_precision(requested, device_type, bf16_supported=spec.peak_flops.get("bf16") is not None)[0]


def model_facts(cfg: Config, info: DataInfo) -> ModelFacts:
    """The model facts of a variant of the recipe that no pre-flight built (plan's other fine-tuning methods: the same
    model without adapters, or without QLoRA): built here on the meta device, train.freeze applied, as the pre-flight
    builds the recipe's own."""
    with torch.device("meta"):
        model, _ = build_model(cfg.model, info)
    if cfg.train.freeze:
        freeze(model, cfg.train.freeze)
    return describe_model(model, cfg.optim, adapters=cfg.model.lora is not None)


def weights_floor_bytes(model: nn.Module, *, shards: int = 1, frozen_stored: bool = True) -> float:
    """A lower bound of every simulated peak per device of `model` (a meta-device build, after `train.freeze`),
    without simulating: its weights, in their own dtype, which are alive through every phase of the step the
    simulation tracks. Trained weights count 1/`shards` (no strategy holds less: FSDP's rank 0 keeps at least
    its share of each parameter, DDP and one device all of it); frozen ones fully when `frozen_stored` (FSDP2
    leaves them whole), not at all when the base is stored quantized (QLoRA, `memory.quantized_base`).
    Gradients and optimizer state are left out on purpose: a parameter the forward never uses gets neither, and
    only running the model shows which. The job admission refuses on it what the simulation would refuse
    anyway, in milliseconds instead of the seconds a deep model's simulation takes."""
    trained = frozen = 0
    for p in model.parameters():  # a tied tensor once
        if p.requires_grad:
            trained += p.numel() * p.element_size()
        else:
            frozen += p.numel() * p.element_size()
    return trained / shards + (frozen if frozen_stored else 0)


def strategies_for(num_gpus: int, adapters: bool = False) -> list[tuple[str, bool]]:
    """In order of preference: (strategy, activation checkpointing).

    LoRA and QLoRA (`adapters`) take DDP, with and without checkpointing: the simulation holds the frozen base as
    buffers, which FSDP2 does not shard, so FSDP would shard only the adapters and their state (under 1% of the
    weights) — no memory the simulation can show, all-gathers for nothing, and one simulation per GPU count."""
    if num_gpus == 1:
        return [("none", False), ("none", True)]
    if adapters:
        return [("ddp", False), ("ddp", True)]
    return [("ddp", False), ("fsdp", False), ("fsdp", True)]


@dataclass(frozen=True)
class MemoryRule:
    """How a simulated peak becomes a need on one GPU (correction terms, a calibrated factor), and the room."""

    usable_bytes: float  # the GPU's memory less the safety margin
    terms: tuple[Term, ...]
    factor: Optional[float]  # a calibrated memory factor replacing the allocator's, or None

    def corrected(self, peak: float) -> int:
        return corrected_peak_bytes(int(peak), list(self.terms), self.factor)[0]

    def corrections(self, peak: float) -> tuple[int, dict[str, int]]:
        return corrected_peak_bytes(int(peak), list(self.terms), self.factor)


@dataclass(frozen=True)
class Fit:
    """The first strategy, in order of preference, whose largest micro-batch fits; and its simulation."""

    strategy: str
    activation_checkpointing: bool
    micro_batch_size: int
    accumulation: int
    simulated_peak_bytes: int
    peak_bytes: int  # with the correction terms
    corrections_bytes: dict[str, int]
    sim: Simulation  # at micro_batch_size


def fit_memory(
    num_gpus: int, per_gpu: int, cache: SimCache, facts: ModelFacts, rule: MemoryRule, precision: str,
    fixed_micro: Optional[int] = None, fixed_checkpointing: Optional[bool] = None,
) -> Union[Fit, str]:
    """Try the strategies in order (only those with activation checkpointing `fixed_checkpointing`, when given)
    and take the largest micro-batch that fits (or `fixed_micro` if it does); the reason nothing fits otherwise.

    Micro-batch 1 and 2 are simulated; their lines (`planning.memory.fit_linear`, a lower bound of the peak at
    larger micro-batches) rule sizes out, and the size taken is simulated, so its peak is the simulation's own."""
    smallest_need = None
    for strategy, ckpt in strategies_for(num_gpus, facts.adapters):
        if fixed_checkpointing is not None and ckpt != fixed_checkpointing:
            continue
        floor = rule.corrected(facts.floor_bytes(num_gpus if strategy == "fsdp" else 1))
        if floor > rule.usable_bytes:  # weights, gradients and optimizer state alone: no need to simulate
            smallest_need = floor if smallest_need is None else min(smallest_need, floor)
            continue
        key = sim_key(strategy, num_gpus, ckpt, precision)
        one = cache.get(key, 1)
        need = rule.corrected(one.peak_bytes)
        smallest_need = need if smallest_need is None else min(smallest_need, need)
        if need > rule.usable_bytes:
            continue

        def simulated(b: int, key: SimKey = key) -> int:
            return rule.corrected(cache.get(key, b).peak_bytes)

        if fixed_micro is not None:
            micro = fixed_micro if simulated(fixed_micro) <= rule.usable_bytes else None
        else:
            line = fit_linear(one, cache.get(key, 2)) if per_gpu >= 2 else LinearPeak(one.peak_bytes, 0.0)
            micro = largest_fitting(per_gpu, rule.usable_bytes, lambda b: rule.corrected(line.at(b)),
                                    confirmed=simulated)
        if micro is None:
            continue
        sim = cache.get(key, micro)
        peak, added = rule.corrections(sim.peak_bytes)
        return Fit(strategy, ckpt, micro, per_gpu // micro, sim.peak_bytes, peak, added, sim)
    return (
        f"needs {smallest_need / 2**30:.1f} GiB per GPU even at micro-batch 1 with every strategy; "
        f"{rule.usable_bytes / 2**30:.1f} GiB usable" if smallest_need else "does not fit"
    )


@dataclass(frozen=True)
class Timing:
    step_time_s: float  # at the mid efficiency, times the calibrated factor
    step_time_range_s: tuple[float, float]  # at the high and the low efficiency
    calibrated_time_factor: Optional[float]
    bound: str
    exposed_comm_s: float
    efficiency: Efficiency


def time_step(
    spec: GPUSpec, fit: Fit, *, num_gpus: int, per_gpu: int, precision: str, efficiency: Efficiency,
    kernels_per_micro_batch: int, time_factor: Optional[float], extra_s_per_micro_batch: float = 0.0,
) -> Timing:
    """The roofline step time of `fit` on `spec` at the mid, high and low efficiency, plus `extra_s_per_micro_batch`
    x accumulation (QLoRA's dequantization, which the matmuls wait for); a calibration on this GPU type (measured /
    predicted step time) scales the answer."""
    sim, accumulation = fit.sim, fit.accumulation

    def at(value: float) -> StepTime:
        return step_time(
            hardware_flops_per_gpu=sim.hardware_flops_per_sample * per_gpu,
            bytes_moved_per_gpu=traffic_per_step(sim, accumulation),
            kernels_per_step=kernels_per_micro_batch * accumulation,
            peak_flops=spec.peak_flops_for(precision),
            bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s,
            efficiency=value,
            strategy=fit.strategy,
            num_gpus=num_gpus,
            accumulation=accumulation,
            grad_bytes=sim.grad_bytes,
            param_bytes=sim.grad_bytes * (0.5 if precision != "fp32" else 1.0),  # gathered in param dtype
            interconnect_bytes_per_s=spec.interconnect_bytes_per_s,
        )

    mid, fast, slow = at(efficiency.mid), at(efficiency.high), at(efficiency.low)
    factor = 1.0 if time_factor is None else time_factor
    extra_s = extra_s_per_micro_batch * accumulation

    def total(t: StepTime) -> float:
        return (t.step_time_s + extra_s) * factor

    return Timing(total(mid), (total(fast), total(slow)), time_factor, mid.bound, mid.exposed_comm_s, efficiency)


@dataclass(frozen=True)
class Pricing:
    total_time_s: float
    cost_usd: Optional[float]  # None without a price
    energy_kwh: float
    price_usd_per_hour: Optional[float]
    price_source: Optional[str]
    within_budget: Optional[bool]  # None without a budget or a price
    within_deadline: Optional[bool]  # None without a deadline


def price_run(
    step_time_s: float, *, steps: int, num_gpus: int, tdp_watts: float, price: Optional[Price],
    budget_usd: Optional[float], deadline_h: Optional[float],
) -> Pricing:
    """Total time, cost and energy of `steps` steps on `num_gpus` GPUs, against the budget and deadline."""
    usd = price.usd_per_hour if price is not None else None
    totals = run_totals(step_time_s, steps, num_gpus, usd, tdp_watts)
    return Pricing(
        total_time_s=totals["total_time_s"],
        cost_usd=totals["cost_usd"],
        energy_kwh=totals["energy_kwh"],
        price_usd_per_hour=usd,
        price_source=None if price is None else f"{price.provider} {price.terms} {price.date}",
        within_budget=None if budget_usd is None or totals["cost_usd"] is None else totals["cost_usd"] <= budget_usd,
        within_deadline=None if deadline_h is None else totals["total_time_s"] <= deadline_h * 3600,
    )


def efficiency_for(
    override: Optional[float], sim: Simulation, facts: ModelFacts, spec: GPUSpec, compiled: bool
) -> Efficiency:
    if override is not None:
        eff = Efficiency(override, override, override, "--efficiency")
    else:
        hopper = any(spec.name.startswith(p) for p in HOPPER_OR_NEWER)
        eff = default_efficiency(sim.param_count, facts.family, hopper, compiled)
    return eff


def traffic_per_step(sim: Simulation, accumulation: int) -> float:
    """HBM bytes per optimizer step: the traffic of one micro-batch (`sim`'s) x accumulation."""
    return sim.memory_traffic_bytes_per_sample * sim.micro_batch_size * accumulation


def rank_key(candidate: Candidate) -> tuple:
    """Fitting first, then priced, then cheapest, then fastest."""
    cost = candidate.cost_usd
    return (not candidate.fits, cost is None, cost or 0.0, candidate.total_time_s or 0.0)


def recommend(candidates: Sequence[Candidate], budget_usd: Optional[float], deadline_h: Optional[float]) -> Recommendation:
    """The fastest, the cheapest, and the cheapest within budget and deadline (each candidate already says
    whether it is within them; ties go to the first in `candidates`)."""
    fitting = [c for c in candidates if c.fits]
    priced = [c for c in fitting if c.cost_usd is not None]
    ok = [c for c in priced if c.within_budget is not False and c.within_deadline is not False]
    best = min(ok, key=lambda c: (c.cost_usd, c.total_time_s)) if ok else None
    reason = None
    if best is None:
        if not fitting:
            reason = "no candidate fits in memory; add GPUs (--num-gpus), pick larger GPUs or shrink the model"
        else:
            reason = "no candidate meets the budget and deadline; relax one of them"
    return Recommendation(
        fastest=min(fitting, key=lambda c: c.total_time_s) if fitting else None,
        cheapest=min(priced, key=lambda c: c.cost_usd) if priced else None,
        recommended=best,
        reason=reason,
    )
