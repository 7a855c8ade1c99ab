"""The before/after table: rich for the terminal, HTML for report.html (compress.json is the data).

The recommended variant (the one `predict` serves from the folder) is marked `*`; a variant slower than fp32
at batch 32 has "slower" after its speedup, so a compression that costs time says so where it is read.
"""
from __future__ import annotations

from html import escape
from typing import Any, Optional

from rich import box
from rich.table import Table

from trainforge.tasks import TASKS

COLUMNS = ("variant", "params", "FLOPs", "size", "x smaller", "b1 ms (p90)", "b32 ms (p90)", "b32 /s",
           "speedup b32", "metric", "Δ pt")


RECOMMENDED_MARK = " *"
SLOWER = " slower"


def served_batch(doc: dict[str, Any]) -> str:
    """The latency column the recommendation was made on (b32; b1 for a task served one sample at a time)."""
    return str((doc.get("recommendation") or {}).get("batch", "b32"))


def columns(doc: dict[str, Any]) -> tuple[str, ...]:
    """COLUMNS, the speedup at the batch the recommendation used."""
    return tuple(f"speedup {served_batch(doc)}" if c == "speedup b32" else c for c in COLUMNS)


def rows(doc: dict[str, Any]) -> list[list[str]]:
    out = []
    metric = TASKS.get(doc["task"]).quality[0]
    served = served_batch(doc)
    for v in doc["variants"]:
        lat, p90 = v["latency_ms"], v["latency_p90_ms"]
        value: Optional[float] = v.get(metric)
        out.append([
            v["name"] + (RECOMMENDED_MARK if v.get("recommended") else ""),
            f"{v['params']:,}",
            _si(v["flops"]),
            _bytes(v["bytes"]),
            f"{v['size_ratio']:.2f}x",
            f"{lat['b1']:.3f} ({p90['b1']:.3f})",
            f"{lat['b32']:.3f} ({p90['b32']:.3f})",
            f"{v['throughput_per_s']['b32']:,.0f}",
            f"{v['speedup'][served]:.2f}x" + (SLOWER if v.get("slower_than_fp32") else ""),
            "-" if value is None else (f"{100 * value:.2f}%" if metric == "accuracy" else f"{value:.3f}"),
            "" if v.get("accuracy_delta_pt") is None else f"{v['accuracy_delta_pt']:+.2f}",
            _si(v["params"]),  # the terminal's compact form
        ])
    return out


TERMINAL_COLUMNS = ("variant", "params", "size", "smaller", "b1 ms", "b32 ms", "b32 gain", "metric", "Δ pt")


def rich_table(doc: dict[str, Any]) -> Table:
    """The terminal's narrower table (p90, FLOPs and throughput are in compress.json and report.html)."""
    table = Table(title=f"compression ({doc['threads']} CPU thread(s); metric on {doc['test_samples']} test samples)",
                  box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0))
    metric = TASKS.get(doc["task"]).quality[1]
    gain = f"{served_batch(doc)} gain"
    for i, name in enumerate(TERMINAL_COLUMNS):
        name = gain if name == "b32 gain" else name
        table.add_column(metric if name == "metric" else name, justify="left" if i == 0 else "right", no_wrap=True)
    for r in rows(doc):
        table.add_row(r[0], r[11], r[3].replace(".0 ", " "), r[4], r[5].split()[0], r[6].split()[0], r[8], r[9], r[10])
    return table


def recommendation_line(doc: dict[str, Any]) -> str:
    """`* recommended: <why>`, the line under the table (empty for a record without a recommendation)."""
    rec = doc.get("recommendation")
    return f"{RECOMMENDED_MARK.strip()} recommended (served by `trainforge predict` on the folder): {rec['reason']}" if rec else ""


def report_section(doc: dict[str, Any]) -> str:
    metric = TASKS.get(doc["task"]).quality[2]
    head = "".join(f"<th>{escape(metric if c == 'metric' else c)}</th>" for c in columns(doc))
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r[:len(COLUMNS)]) + "</tr>" for r in rows(doc))
    notes = [f"Latency: onnxruntime on the CPU with {doc['threads']} thread(s), median (p90) of repeated runs; "
             f"metrics on the test split ({doc['test_samples']} samples)."]
    if doc.get("recommendation"):
        notes.append(escape(recommendation_line(doc)))
    if doc.get("int8_method"):
        notes.append(f"int8: ONNX Runtime {doc['int8_method']} quantization.")
    if doc.get("pruning") and doc["pruning"].get("skipped"):
        notes.append(f"Pruning skipped: {escape(doc['pruning']['skipped'])}")
    elif doc.get("pruning"):
        p = doc["pruning"]
        notes.append(f"Pruning: {p['ratio']:.0%} of each prunable width; parameters {p['params_before']:,} → "
                     f"{p['params_after']:,}, FLOPs {_si(p['flops_before'])} → {_si(p['flops_after'])}.")
    if doc.get("finetune"):
        f = doc["finetune"]
        notes.append(f"Fine-tuned {f['epochs']} epoch(s), {f['steps']} steps"
                     f"{', distilled from the unpruned model' if f['distill'] else ''}: {escape(f['run_dir'])}.")
    notes.append(f"Artifacts: {escape(doc['out'])}")
    return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            + "".join(f'<p class="note">{n}</p>' for n in notes))


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _si(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"
