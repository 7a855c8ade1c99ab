"""Rich tables for `trainforge plan`: the simulated step, the candidates, the recommendation."""
from __future__ import annotations

from typing import Any, Iterator, Optional

from rich.table import Table
from rich.text import Text

from trainforge.planning.calibration_store import describe
from trainforge.planning.result import Plan



def _time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
    return f"{seconds / 3600:.1f} h"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _usd(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"${value:,.2f}" if value >= 0.01 else f"${value:.4f}"


def render_plan(result: Plan) -> Iterator[Any]:
    sim = result.simulation
    head = Table(title=f"{result.recipe}: simulated step (micro-batch {sim.micro_batch_size}, {sim.precision}, one device)",
                 show_header=False)
    head.add_row("parameters", f"{sim.param_count:,}")
    head.add_row("peak memory (no corrections)", _bytes(sim.peak_bytes))
    for k, v in sim.breakdown.items():
        head.add_row(f"  {k}", _bytes(v))
    head.add_row("model FLOPs / step", f"{sim.model_flops_per_step:.3e}")
    head.add_row("hardware FLOPs / step", f"{sim.hardware_flops_per_step:.3e}")
    head.add_row("samples / tokens per step", f"{sim.samples_per_step:,} / {sim.tokens_per_step:,}")
    head.add_row("optimizer steps", f"{result.steps:,}")
    yield head
    if result.methods:
        yield _methods(result)

    methods = result.methods is not None  # a fine-tuning recipe: each candidate says its method
    table = Table(title="candidates (cheapest first; peak includes correction terms; step time at the "
                  "mid efficiency, range in brackets)")
    for col in ("gpu", "n", *(("method",) if methods else ()), "fits", "strategy", "micro x acc", "peak/GPU", "step",
                "total", "cost", "kWh", "bound"):
        table.add_column(col, justify="left" if col in ("gpu", "method", "strategy", "bound") else "right")
    for c in result.candidates:
        first = (c.gpu, str(c.num_gpus), *((c.method,) if methods else ()))
        if not c.fits:
            table.add_row(*first, Text("no", style="red"), Text(c.reason or "", style="dim"))
            continue
        strategy = c.strategy + ("+ckpt" if c.activation_checkpointing else "")
        flags = []
        if c.within_budget is False:
            flags.append("over budget")
        if c.within_deadline is False:
            flags.append("late")
        fast_s, slow_s = c.step_time_range_s
        table.add_row(
            *first, Text("yes", style="green"), strategy,
            f"{c.micro_batch_size} x {c.accumulation}", _bytes(c.peak_bytes_per_gpu),
            f"{_time(c.step_time_s)} ({_time(fast_s)}-{_time(slow_s)})",
            _time(c.total_time_s), _usd(c.cost_usd),
            f"{c.energy_kwh:.2f}", c.bound + (f" ({', '.join(flags)})" if flags else ""),
        )
    yield table

    rec = result.recommendation
    summary = Table(title="recommendation", show_header=False)
    for label, c in (("recommended", rec.recommended), ("fastest", rec.fastest), ("cheapest", rec.cheapest)):
        summary.add_row(label, "-" if c is None else
                        f"{c.num_gpus} x {c.gpu} {c.strategy}{f' ({c.method})' if methods else ''}, micro-batch {c.micro_batch_size} x "
                        f"{c.accumulation}: {_time(c.total_time_s)}, {_usd(c.cost_usd)}")
    if rec.reason:
        summary.add_row("note", rec.reason)
    yield summary


def _methods(result: Plan) -> Table:
    """A fine-tuning recipe's methods side by side: each one's own step (the recipe's micro-batch, one device)."""
    sims = result.methods or {}
    first = next(iter(sims.values()))
    table = Table(title=f"fine-tuning methods (micro-batch {first.micro_batch_size}, {first.precision}, one device, "
                  "no correction terms)")
    table.add_column("")
    for name in sims:
        table.add_column(name, justify="right")
    rows = [("peak memory", [s.peak_bytes for s in sims.values()])]
    keys = [k for k in dict.fromkeys(k for s in sims.values() for k in s.breakdown)
            if any(s.breakdown.get(k) for s in sims.values())]
    rows += [(f"  {k}", [s.breakdown.get(k, 0) for s in sims.values()]) for k in keys]
    for label, values in rows:
        table.add_row(label, *(_bytes(v) for v in values))
    table.add_row("hardware FLOPs / step", *(f"{s.hardware_flops_per_step:.3e}" for s in sims.values()))
    return table


def render_calibration(entry: dict[str, Any]) -> Table:
    table = Table(title=f"calibration on {entry['device']} ({entry['recipe']}, micro-batch {entry['micro_batch_size']}, {entry['precision']})")
    for col in ("quantity", "predicted", "measured", "measured / predicted"):
        table.add_column(col, justify="left" if col == "quantity" else "right")
    for name, predicted, measured in describe(entry):
        ratio = "-" if measured is None or not predicted else f"{measured / predicted:.2f}"
        table.add_row(name, f"{predicted:.4g}", "-" if measured is None else f"{measured:.4g}", ratio)
    table.caption = f"stored in {entry['stored_in']}; later plans for {entry['device']} use it"
    return table
