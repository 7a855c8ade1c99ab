"""Charts for the run report, rendered to PNG bytes.

    charts = training_charts(read_metrics(run_dir / "metrics.jsonl"))   # [(title, png_bytes), ...]
    png = confusion_matrix_png(eval_json["confusion_matrix"], eval_json["class_names"])

Figures are drawn with `matplotlib.figure.Figure` on an explicit Agg canvas, never pyplot, so
rendering works headless and leaves the user's global matplotlib backend alone.
"""
from __future__ import annotations

import io
import math
from typing import Mapping, Optional, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

Series = tuple[list[float], list[float]]  # (steps, values), sorted by step

_DPI = 100
_LINE_FIGSIZE_IN = (6.4, 3.6)
_MARKERS_UP_TO_POINTS = 30  # a line through 1-2 points is invisible; show markers for short runs
_ANNOTATE_UP_TO_CLASSES = 20  # beyond this the cell counts are unreadable
_MAX_TICK_LABELS = 40
_MIB = 2**20


def metric_series(rows: Sequence[Mapping], split: str, key: str, scale: float = 1.0) -> Series:
    """(steps, values) of one metric of one split; missing and null (non-finite) values are left out.

    When a step occurs more than once (a resumed run re-logs the steps after its checkpoint), the
    row written last wins, so the curve shows what the surviving run did.
    """
    last_row_by_step: dict[float, Mapping] = {}
    for row in rows:
        if row.get("split") == split and _is_number(row.get("step")):
            last_row_by_step[row["step"]] = row
    steps: list[float] = []
    values: list[float] = []
    for step in sorted(last_row_by_step):
        value = last_row_by_step[step].get(key)
        if _is_number(value) and math.isfinite(value):
            steps.append(step)
            values.append(value * scale)
    return steps, values


def line_chart_png(title: str, ylabel: str, series: Mapping[str, Series], logy: bool = False,
                   ylim: Optional[tuple[float, float]] = None) -> bytes:
    """One chart with a line per named series, x = optimizer step."""
    fig = Figure(figsize=_LINE_FIGSIZE_IN, dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, (steps, values) in series.items():
        marker = "o" if len(steps) <= _MARKERS_UP_TO_POINTS else None
        ax.plot(steps, values, label=label, marker=marker, markersize=3, linewidth=1.5)
    if logy:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        ax.legend()
    return _png(fig)


def confusion_matrix_png(matrix: Sequence[Sequence[int]], class_names: Sequence[str]) -> bytes:
    """Heatmap of counts, rows = true class, columns = predicted class, labelled with class names."""
    counts = np.asarray(matrix, dtype=np.int64)
    n = counts.shape[0]
    assert counts.shape == (n, n) and len(class_names) == n, "confusion matrix must be square and named"
    side_in = min(max(0.35 * n + 2.5, 4.5), 14.0)
    fig = Figure(figsize=(side_in + 1.0, side_in), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(counts, cmap="Blues", interpolation="nearest")
    colorbar = fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    colorbar.locator = MaxNLocator(integer=True)  # counts: no 0.25 ticks
    colorbar.update_ticks()

    every = max(1, math.ceil(n / _MAX_TICK_LABELS))
    ticks = list(range(0, n, every))
    names = [str(class_names[i]) for i in ticks]
    # parse_math=False: a class name such as "$5" must not be read as TeX.
    ax.set_xticks(ticks, labels=names, rotation=45, ha="right", parse_math=False)
    ax.set_yticks(ticks, labels=names, parse_math=False)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title("Confusion matrix")

    if n <= _ANNOTATE_UP_TO_CLASSES:
        threshold = counts.max() / 2 if counts.size else 0
        for i in range(n):
            for j in range(n):
                color = "white" if counts[i, j] > threshold else "black"
                ax.text(j, i, str(counts[i, j]), ha="center", va="center", color=color, fontsize=8)
    return _png(fig)


def training_charts(rows: Sequence[Mapping]) -> list[tuple[str, bytes]]:
    """Every chart the rows have data for, in report order: loss, val metrics, lr, throughput, memory."""
    charts: list[tuple[str, bytes]] = []

    def add(title: str, ylabel: str, named: Mapping[str, Series], **kwargs) -> None:
        present = {label: s for label, s in named.items() if s[0]}
        if present:
            charts.append((title, line_chart_png(title, ylabel, present, **kwargs)))

    add("Loss", "loss", {"train": metric_series(rows, "train", "loss"), "val": metric_series(rows, "val", "loss")})
    add("Validation accuracy and macro-F1", "score",
        {"accuracy": metric_series(rows, "val", "accuracy"), "macro_f1": metric_series(rows, "val", "macro_f1")},
        ylim=(0.0, 1.02))
    add("Validation perplexity", "perplexity", {"perplexity": metric_series(rows, "val", "perplexity")}, logy=True)
    add("Learning rate", "lr", {"lr": metric_series(rows, "train", "lr")})
    add("Throughput", "samples/s", {"samples/s": metric_series(rows, "train", "samples_per_s")})
    memory = metric_series(rows, "train", "peak_mem_bytes", scale=1 / _MIB)
    if any(v > 0 for v in memory[1]):  # all zeros means the device did not report memory
        add("Peak memory", "MiB", {"peak memory": memory})
    return charts


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return buf.getvalue()


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
