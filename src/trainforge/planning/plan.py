"""`trainforge plan`: memory, time, cost and energy of a recipe on candidate GPUs, and a recommended setup.

    result = plan(cfg, gpus=["h100-sxm", "rtx-4090"], num_gpus=[1, 2, 4, 8], budget_usd=500)
    result["simulation"]      # the recipe's own step, simulated: peak bytes, breakdown, FLOPs per step
    result["candidates"]      # one row per GPU type x count: fits?, strategy, micro-batch, time, cost, energy
    result["recommendation"]  # fastest, cheapest, and the pick within budget and deadline

For each GPU type and count the strategies are tried in order — DDP (one GPU: plain) when the whole
model fits, else FSDP, else FSDP (or plain) with activation checkpointing — and the largest micro-batch
that fits with a 10% margin is taken, accumulation keeping the global batch. Memory comes from the
fake-tensor simulation (`planning.simulate`) plus the correction terms of `planning.corrections`;
time from the roofline of `planning.roofline`. Simulations are shared by every GPU (docs/planner.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence


from trainforge.config import Config
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.hardware.catalog import Catalog, GPUSpec, load_catalog
from trainforge.planning.calibrate import load_calibration
from trainforge.planning.corrections import applicable, corrected_peak_bytes
from trainforge.planning.kernels import kernels_per_micro_batch
from trainforge.planning.local import local_spec, spec_for
from trainforge.planning.memory import SAFETY_MARGIN, LinearPeak, SimCache, SimKey, fit_linear, largest_fitting
from trainforge.planning.roofline import Efficiency, default_efficiency, run_totals, step_time
from trainforge.planning.simulate import Simulation, simulate_step
from trainforge.training.microbatch import batch_geometry

DEFAULT_NUM_GPUS = (1, 2, 4, 8)
HOPPER_OR_NEWER = ("h100", "h200", "b200", "gh200")


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know about the architecture, read once from a meta-device build."""

    family: str  # transformer | conv | other
    convolutional: bool
    param_count: int
    state_bytes_per_param: int  # fp32 weights + fp32 gradients + optimizer state: the floor of any step


OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4}  # two fp32 moments; one fp32 momentum buffer (0 without momentum)


class Planner:
    """Everything about one recipe that does not depend on the GPU: data facts, step count, the shared
    simulation cache and kernel counts. `candidate(spec, n)` prices one GPU type x count."""

    def __init__(self, cfg: Config, info: Optional[DataInfo] = None, steps: Optional[int] = None) -> None:
        if info is None or steps is None:
            from trainforge.data import build_data
            from trainforge.data.loader import steps_per_epoch

            data = build_data(cfg.data, seed=cfg.seed)
            info = data.info
            steps = cfg.train.max_steps or cfg.train.epochs * steps_per_epoch(len(data.train), cfg.train.global_batch_size)
        self.cfg, self.info, self.steps = cfg, info, steps
        self.facts = model_facts(cfg, info)
        self.cache = SimCache(lambda key, b: simulate_step(
            cfg.model, cfg.optim, info, micro_batch_size=b, precision=key.precision, strategy=key.strategy,
            world_size=key.world_size, activation_checkpointing=key.activation_checkpointing,
            label_smoothing=cfg.train.label_smoothing,
        ))
        self._kernels: dict[str, int] = {}

    def kernel_count(self, precision: str) -> int:
        if precision not in self._kernels:
            self._kernels[precision] = kernels_per_micro_batch(self.cfg.model, self.info, 1, precision)
        return self._kernels[precision]

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
        device_type: str = "cuda",
    ) -> dict[str, Any]:
        return plan_one(
            spec, num_gpus, precision=precision, global_batch=self.cfg.train.global_batch_size, steps=self.steps,
            cache=self.cache, facts=self.facts, compiled=self.cfg.train.compile, efficiency=efficiency,
            kernel_count=self.kernel_count, price=price, calibration=calibration or {}, budget_usd=budget_usd,
            deadline_h=deadline_h, fixed_micro=fixed_micro, device_type=device_type,
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
) -> dict[str, Any]:
    catalog = catalog or load_catalog()
    specs = [spec_for(g, catalog) for g in gpus] if gpus else [catalog.get(n) for n in catalog.names()]
    counts = sorted(set(int(n) for n in num_gpus))
    if not counts or counts[0] < 1:
        raise UserError(f"--num-gpus: expected positive counts like 1,2,4,8, got {list(num_gpus)}")
    if efficiency is not None and not 0 < efficiency <= 1:
        raise UserError(f"--efficiency: expected a fraction in (0, 1], got {efficiency}")
    calibration = load_calibration() if calibration is None else calibration
    planner = Planner(cfg)
    global_batch = cfg.train.global_batch_size

    rows = []
    for spec in specs:
        device_type = "cpu" if spec.name == "cpu" else "cuda"
        precision = gpu_precision(cfg.train.precision, spec) if device_type == "cuda" else _cpu_precision(cfg)
        for n in counts if device_type == "cuda" else [1]:
            rows.append(planner.candidate(
                spec, n, precision=precision, price=None if device_type == "cpu" else catalog.price(spec.name),
                calibration=calibration.get(spec.name, {}), efficiency=efficiency, budget_usd=budget_usd,
                deadline_h=deadline_h, device_type=device_type,
            ))

    micro = (batch_geometry(global_batch, cfg.train.micro_batch_size).micro_batch_size  # an upper bound, as in training
             if isinstance(cfg.train.micro_batch_size, int) else 1)
    own_precision = "fp32" if cfg.train.precision == "fp32" else "bf16"
    own = planner.cache.get(SimKey("none", 1, False, own_precision), micro)
    return {
        "recipe": cfg.name,
        "steps": planner.steps,
        "global_batch_size": global_batch,
        "simulation": {
            "micro_batch_size": micro,
            "precision": own_precision,
            "peak_bytes": own.peak_bytes,
            "breakdown": own.breakdown,
            "param_count": own.param_count,
            "model_flops_per_step": own.model_flops_per_sample * global_batch,
            "hardware_flops_per_step": own.hardware_flops_per_sample * global_batch,
            "samples_per_step": global_batch,
            "tokens_per_step": global_batch * own.tokens_per_sample,
            "accumulation": global_batch // micro,
            "simulations_run": len(planner.cache.runs),
        },
        "candidates": sorted(rows, key=rank_key),
        "recommendation": recommend(rows, budget_usd, deadline_h),
    }


def plan_local_step(
    cfg: Config, device, catalog: Catalog, *, micro_batch_size: int, calibration: Optional[dict] = None
) -> dict[str, Any]:
    """The prediction for `cfg` as configured on this machine's device (one device, no parallelism)."""
    from trainforge.training.precision import resolve_precision

    spec = local_spec(device, catalog)
    row = Planner(cfg).candidate(
        spec, 1, precision=resolve_precision(cfg.train.precision, device),
        calibration=(calibration if calibration is not None else load_calibration()).get(spec.name, {}),
        fixed_micro=micro_batch_size, device_type=device.type,
    )
    if not row["fits"]:
        raise UserError(f"{cfg.name}: micro-batch {micro_batch_size} does not fit this {spec.name}: {row['reason']}")
    return row


def _cpu_precision(cfg: Config) -> str:
    return "fp32" if cfg.train.precision in ("auto", "fp32") else cfg.train.precision


def gpu_precision(requested: str, spec: GPUSpec) -> str:
    """`auto` and `bf16` fall back to fp16 on GPUs without bf16 (V100, T4), as training does."""
    if requested == "fp32":
        return "fp32"
    if requested == "fp16" or spec.peak_flops.get("bf16") is None:
        return "fp16"
    return "bf16"


def model_facts(cfg: Config, info: DataInfo) -> ModelFacts:
    import torch

    from trainforge.models import build_model, is_convolutional

    with torch.device("meta"):
        model, _ = build_model(cfg.model, info)
    attention = any("attention" in type(m).__name__.lower() for m in model.modules())
    conv = is_convolutional(model)
    family = "transformer" if attention else ("conv" if conv else "other")
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    optim_state = OPTIMIZER_STATE_BYTES.get(cfg.optim.name, 8)
    if cfg.optim.name == "sgd" and cfg.optim.momentum == 0:
        optim_state = 0
    return ModelFacts(family, conv, params, 4 + 4 + optim_state)


def strategies_for(num_gpus: int) -> list[tuple[str, bool]]:
    """In order of preference: (strategy, activation checkpointing)."""
    if num_gpus == 1:
        return [("none", False), ("none", True)]
    return [("ddp", False), ("fsdp", False), ("fsdp", True)]


def plan_one(
    spec: GPUSpec,
    num_gpus: int,
    *,
    precision: str,
    global_batch: int,
    steps: int,
    cache: SimCache,
    facts: ModelFacts,
    compiled: bool,
    efficiency: Optional[float],
    kernel_count,
    price,
    calibration: dict[str, float],
    budget_usd: Optional[float],
    deadline_h: Optional[float],
    fixed_micro: Optional[int] = None,
    device_type: str = "cuda",
) -> dict[str, Any]:
    row: dict[str, Any] = {"gpu": spec.name, "num_gpus": num_gpus, "precision": precision, "fits": False}
    if global_batch % num_gpus:
        row["reason"] = f"global batch {global_batch} does not divide over {num_gpus} GPUs"
        return row
    per_gpu = global_batch // num_gpus
    usable = spec.memory_bytes * SAFETY_MARGIN
    terms = applicable(device_type, num_gpus, facts.convolutional)
    factor = calibration.get("memory_factor")

    def corrected(peak: float) -> float:
        return corrected_peak_bytes(int(peak), terms, factor)[0]

    memory_class = "fp32" if precision == "fp32" else "bf16"
    smallest_need = None
    for strategy, ckpt in strategies_for(num_gpus):
        floor = facts.param_count * facts.state_bytes_per_param / (num_gpus if strategy == "fsdp" else 1)
        if corrected(floor) > usable:  # weights, gradients and optimizer state alone: no need to simulate
            smallest_need = corrected(floor) if smallest_need is None else min(smallest_need, corrected(floor))
            continue
        key = SimKey("fsdp" if strategy == "fsdp" else "none", num_gpus if strategy == "fsdp" else 1, ckpt, memory_class)
        one = cache.get(key, 1)
        need = corrected(one.peak_bytes)
        smallest_need = need if smallest_need is None else min(smallest_need, need)
        if need > usable:
            continue
        two = cache.get(key, 2) if per_gpu >= 2 else one
        line = fit_linear(one, two) if two is not one else LinearPeak(one.peak_bytes, 0.0)
        if fixed_micro is not None:
            micro = fixed_micro if corrected(line.at(fixed_micro)) <= usable else None
        else:
            micro = largest_fitting(line, per_gpu, usable, corrected)
        if micro is None:
            continue
        accumulation = per_gpu // micro
        eff = efficiency_for(efficiency, one, facts, spec, compiled)
        times = {
            name: step_time(
                hardware_flops_per_gpu=one.hardware_flops_per_sample * per_gpu,
                bytes_moved_per_gpu=traffic_per_step(one, two, micro, accumulation),
                kernels_per_step=kernel_count(precision) * accumulation,
                peak_flops=spec.peak_flops_for(precision),
                bandwidth_bytes_per_s=spec.memory_bandwidth_bytes_per_s,
                efficiency=value,
                strategy=strategy,
                num_gpus=num_gpus,
                accumulation=accumulation,
                grad_bytes=one.grad_bytes,
                param_bytes=one.grad_bytes * (0.5 if precision != "fp32" else 1.0),  # gathered in param dtype
                interconnect_bytes_per_s=spec.interconnect_bytes_per_s,
            )
            for name, value in (("mid", eff.mid), ("fast", eff.high), ("slow", eff.low))
        }
        mid = times["mid"]
        # a calibration on this GPU type (measured / predicted step time) scales the roofline's answer
        time_factor = calibration.get("time_factor", 1.0)
        step_s = mid.step_time_s * time_factor
        usd = price.usd_per_hour if price is not None else None
        totals = run_totals(step_s, steps, num_gpus, usd, spec.tdp_watts)
        peak, added = corrected_peak_bytes(int(line.at(micro)), terms, factor)
        row.update(
            fits=True,
            strategy=strategy,
            activation_checkpointing=ckpt,
            micro_batch_size=micro,
            accumulation=accumulation,
            peak_bytes_per_gpu=peak,
            simulated_peak_bytes_per_gpu=int(line.at(micro)),
            corrections_bytes=added,
            memory_bytes=spec.memory_bytes,
            step_time_s=step_s,
            step_time_range_s=[times["fast"].step_time_s * time_factor, times["slow"].step_time_s * time_factor],
            calibrated_time_factor=calibration.get("time_factor"),
            bound=mid.bound,
            exposed_comm_s=mid.exposed_comm_s,
            efficiency=eff.mid,
            efficiency_range=[eff.low, eff.high],
            efficiency_source=eff.source,
            **totals,
            price_usd_per_hour=usd,
            price_source=None if price is None else f"{price.provider} {price.terms} {price.date}",
            within_budget=None if budget_usd is None or totals["cost_usd"] is None else totals["cost_usd"] <= budget_usd,
            within_deadline=None if deadline_h is None else totals["total_time_s"] <= deadline_h * 3600,
        )
        return row
    row["reason"] = (
        f"needs {smallest_need / 2**30:.1f} GiB per GPU even at micro-batch 1 with every strategy; "
        f"{usable / 2**30:.1f} GiB usable" if smallest_need else "does not fit"
    )
    return row


def efficiency_for(
    override: Optional[float], sim: Simulation, facts: ModelFacts, spec: GPUSpec, compiled: bool
) -> Efficiency:
    if override is not None:
        eff = Efficiency(override, override, override, "--efficiency")
    else:
        hopper = any(spec.name.startswith(p) for p in HOPPER_OR_NEWER)
        eff = default_efficiency(sim.param_count, facts.family, hopper, compiled)
    return eff


def traffic_per_step(one: Simulation, two: Simulation, micro: int, accumulation: int) -> float:
    """HBM bytes per optimizer step: one micro-batch's traffic (linear in the micro-batch) x accumulation."""
    t1 = one.memory_traffic_bytes_per_sample * one.micro_batch_size
    t2 = two.memory_traffic_bytes_per_sample * two.micro_batch_size
    slope = (t2 - t1) / (two.micro_batch_size - one.micro_batch_size) if two is not one else 0.0
    return (t1 + slope * (micro - one.micro_batch_size)) * accumulation


def rank_key(row: dict[str, Any]) -> tuple:
    cost = row.get("cost_usd")
    return (not row["fits"], cost is None, cost or 0.0, row.get("total_time_s") or 0.0)


def recommend(rows: list[dict[str, Any]], budget_usd: Optional[float], deadline_h: Optional[float]) -> dict[str, Any]:
    fitting = [r for r in rows if r["fits"]]
    priced = [r for r in fitting if r.get("cost_usd") is not None]
    ok = [r for r in priced if r.get("within_budget") is not False and r.get("within_deadline") is not False]

    def pick(r: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
        return None if r is None else {k: r[k] for k in ("gpu", "num_gpus", "strategy", "micro_batch_size",
                                                         "accumulation", "total_time_s", "cost_usd")}

    best = min(ok, key=lambda r: (r["cost_usd"], r["total_time_s"])) if ok else None
    out = {
        "fastest": pick(min(fitting, key=lambda r: r["total_time_s"]) if fitting else None),
        "cheapest": pick(min(priced, key=lambda r: r["cost_usd"]) if priced else None),
        "recommended": pick(best),
    }
    if best is None:
        if not fitting:
            out["reason"] = "no candidate fits in memory; add GPUs (--num-gpus), pick larger GPUs or shrink the model"
        else:
            out["reason"] = "no candidate meets the budget and deadline; relax one of them"
    return out
