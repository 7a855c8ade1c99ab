"""Rich tables for `trainforge plan`: the simulated step, the candidates, the recommendation."""
from __future__ import annotations

from typing import Any, Iterator, Optional

from rich.table import Table
from rich.text import Text



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


def render_plan(result: dict[str, Any]) -> Iterator[Any]:
    sim = result["simulation"]
    head = Table(title=f"{result['recipe']}: simulated step (micro-batch {sim['micro_batch_size']}, {sim['precision']}, one device)",
                 show_header=False)
    head.add_row("parameters", f"{sim['param_count']:,}")
    head.add_row("peak memory (no corrections)", _bytes(sim["peak_bytes"]))
    for k, v in sim["breakdown"].items():
        head.add_row(f"  {k}", _bytes(v))
    head.add_row("model FLOPs / step", f"{sim['model_flops_per_step']:.3e}")
    head.add_row("hardware FLOPs / step", f"{sim['hardware_flops_per_step']:.3e}")
    head.add_row("samples / tokens per step", f"{sim['samples_per_step']:,} / {sim['tokens_per_step']:,}")
    head.add_row("optimizer steps", f"{result['steps']:,}")
    yield head

    table = Table(title="candidates (cheapest first; peak includes correction terms; step time at the "
                  "mid efficiency, range in brackets)")
    for col in ("gpu", "n", "fits", "strategy", "micro x acc", "peak/GPU", "step", "total", "cost", "kWh", "bound"):
        table.add_column(col, justify="left" if col in ("gpu", "strategy", "bound") else "right")
    for r in result["candidates"]:
        if not r["fits"]:
            table.add_row(r["gpu"], str(r["num_gpus"]), Text("no", style="red"), Text(r.get("reason", ""), style="dim"))
            continue
        strategy = r["strategy"] + ("+ckpt" if r["activation_checkpointing"] else "")
        flags = []
        if r.get("within_budget") is False:
            flags.append("over budget")
        if r.get("within_deadline") is False:
            flags.append("late")
        table.add_row(
            r["gpu"], str(r["num_gpus"]), Text("yes", style="green"), strategy,
            f"{r['micro_batch_size']} x {r['accumulation']}", _bytes(r["peak_bytes_per_gpu"]),
            f"{_time(r['step_time_s'])} ({_time(r['step_time_range_s'][0])}-{_time(r['step_time_range_s'][1])})",
            _time(r["total_time_s"]), _usd(r["cost_usd"]),
            f"{r['energy_kwh']:.2f}", r["bound"] + (f" ({', '.join(flags)})" if flags else ""),
        )
    yield table

    rec = result["recommendation"]
    summary = Table(title="recommendation", show_header=False)
    for label in ("recommended", "fastest", "cheapest"):
        r = rec.get(label)
        summary.add_row(label, "-" if r is None else
                        f"{r['num_gpus']} x {r['gpu']} {r['strategy']}, micro-batch {r['micro_batch_size']} x "
                        f"{r['accumulation']}: {_time(r['total_time_s'])}, {_usd(r['cost_usd'])}")
    if rec.get("reason"):
        summary.add_row("note", rec["reason"])
    yield summary


def render_calibration(entry: dict[str, Any]) -> Table:
    from trainforge.planning.calibrate import describe

    table = Table(title=f"calibration on {entry['device']} ({entry['recipe']}, micro-batch {entry['micro_batch_size']}, {entry['precision']})")
    for col in ("quantity", "predicted", "measured", "measured / predicted"):
        table.add_column(col, justify="left" if col == "quantity" else "right")
    for name, predicted, measured in describe(entry):
        ratio = "-" if measured is None or not predicted else f"{measured / predicted:.2f}"
        table.add_row(name, f"{predicted:.4g}", "-" if measured is None else f"{measured:.4g}", ratio)
    table.caption = f"stored in {entry['stored_in']}; later plans for {entry['device']} use it"
    return table
