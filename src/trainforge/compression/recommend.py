"""Which variant of a compression to serve: a pure function of the numbers the table recorded.

    rec = recommend(doc["variants"], tolerance_pt=1.0)
    rec.name     # "int8"
    rec.reason   # "int8: fastest at batch 32 (1.080 ms, 1.60x fp32) of the variants within 1 accuracy point of fp32"
    rec = recommend(doc["variants"], batch="b1")   # a task served one sample at a time (a detector)

The rule (docs/architecture.md, "Contracts", `compress --json`): among the ONNX variants whose accuracy is within `tolerance_pt`
points of fp32's (or the task's own quality, a fraction, `points`: a detector's mAP@.5, a segmenter's mIoU; language
models: perplexity at most `tolerance_pt` percent above fp32's), the one with the
lowest median latency at the batch the task is served at (`Task.served_batch`: 32, the throughput figure, for a task
served in batches; 1 for a detector, served image by image); equal latencies go to the smaller file, then to the
earlier row. fp32 is
always eligible, so a compressed variant is recommended only when it is at least as fast as fp32 on the machine
that measured it. `predict` serves the recommended variant of a folder without measuring anything.
Standard library only: `predict` reads this where torch is absent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

ACCURACY_TOLERANCE_PT = 1.0
REFERENCE = "fp32"
BATCH = "b32"
SERVABLE_SUFFIX = ".onnx"  # predict serves ONNX files; a torchao .pt variant is measured, not served


@dataclass(frozen=True)
class Recommendation:
    name: str
    reason: str


def servable(row: dict[str, Any]) -> bool:
    return str(row.get("path", "")).endswith(SERVABLE_SUFFIX)


def quality_loss(row: dict[str, Any], base: dict[str, Any], points: str = "accuracy") -> Optional[float]:
    """Points of `points` (accuracy, or the task's quality fraction) lost against `base` (perplexity: percent
    gained); None when not measured."""
    if row.get(points) is not None and base.get(points) is not None:
        return 100.0 * (base[points] - row[points])
    if row.get("perplexity") is not None and base.get("perplexity"):
        return 100.0 * (row["perplexity"] / base["perplexity"] - 1.0)
    return None


def batch_key(served_batch: int) -> str:
    """The latency column of the batch a task is served at: b1, or b32 for any batch of several."""
    return "b1" if served_batch == 1 else BATCH


def slower_than_reference(row: dict[str, Any], base: dict[str, Any], batch: str = BATCH) -> bool:
    """True when `row` took longer than fp32 at `batch` (the table flags it)."""
    return row["latency_ms"][batch] > base["latency_ms"][batch]


def recommend(variants: Sequence[dict[str, Any]], tolerance_pt: float = ACCURACY_TOLERANCE_PT,
              points: str = "accuracy", batch: str = BATCH) -> Recommendation:
    """The variant to serve by default, and why (see module doc). `variants`: compress.json's rows; `points`: the
    row's key of the quality whose points the tolerance counts (a fraction, higher is better); `batch`: the
    latency column the choice is made on (`batch_key` of the task's served batch)."""
    size = batch.removeprefix("b")
    base = next((v for v in variants if v["name"] == REFERENCE), None)
    if base is None:
        raise ValueError(f"no {REFERENCE} row among {[v['name'] for v in variants]}: it is the reference")
    if base.get(points) is not None:
        within = f"within {tolerance_pt:g} {points} point{'' if tolerance_pt == 1 else 's'} of {REFERENCE}"
    elif base.get("perplexity") is not None:
        within = f"at most {tolerance_pt:g}% above {REFERENCE}'s perplexity"
    else:  # a task whose quality is not measured in the rows: only fp32 is known to keep it
        within = f"known to keep {REFERENCE}'s quality"
    eligible, excluded = [], []
    for v in variants:
        if not servable(v):
            continue
        loss = 0.0 if v is base else quality_loss(v, base, points)
        if loss is not None and loss <= tolerance_pt + 1e-9:
            eligible.append(v)
        else:
            excluded.append((v, loss))
    order = {id(v): i for i, v in enumerate(variants)}
    best = min(eligible, key=lambda v: (v["latency_ms"][batch], v["bytes"], order[id(v)]))
    ms = best["latency_ms"][batch]
    ref_ms = base["latency_ms"][batch]
    if best is base:
        reason = f"{REFERENCE}: no compressed variant {within} is faster at batch {size}"
        others = [f"{v['name']} {v['latency_ms'][batch]:.3f} ms" for v in eligible if v is not base]
        reason += f" ({REFERENCE} {ref_ms:.3f} ms; {', '.join(others)})" if others else f" ({REFERENCE} {ref_ms:.3f} ms)"
    else:
        reason = f"{best['name']}: fastest at batch {size} ({ms:.3f} ms, {ref_ms / ms:.2f}x {REFERENCE}) of the variants {within}"
    tied = [v["name"] for v in eligible if v is not best and v["latency_ms"][batch] == ms]
    if tied:
        reason += f"; as fast as {', '.join(tied)} and smaller"
    faster_out = [f"{v['name']} ({'not measured' if loss is None else f'{loss:+.2f}'})" for v, loss in excluded
                  if v["latency_ms"][batch] < ms]
    if faster_out:
        reason += f"; faster but beyond the tolerance: {', '.join(faster_out)}"
    return Recommendation(best["name"], reason)


def mark(variants: list[dict[str, Any]], tolerance_pt: float = ACCURACY_TOLERANCE_PT,
         points: str = "accuracy", batch: str = BATCH) -> Recommendation:
    """Set `recommended` (true on exactly one row) and `slower_than_fp32` (at `batch`) on every row; returns the
    choice."""
    rec = recommend(variants, tolerance_pt, points, batch)
    base = next(v for v in variants if v["name"] == REFERENCE)
    for v in variants:
        v["recommended"] = v["name"] == rec.name
        v["slower_than_fp32"] = slower_than_reference(v, base, batch)
    return rec
