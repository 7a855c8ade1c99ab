"""Charts for the run report, rendered to PNG bytes (and, for `runs compare`, to inline SVG).

    charts = training_charts(read_metrics(RunDir(run_dir).metrics))   # [(title, png_bytes), ...]
    figures = training_figures(rows)                                     # the same as Figures: [(title, Figure)]
    png = confusion_matrix_png(eval_json["confusion_matrix"], eval_json["class_names"])
    svg = svg_element(line_chart(title, ylabel, {"run a": series_a, "run b": series_b}))   # "<svg ...>...</svg>"

Figures are drawn with `matplotlib.figure.Figure` on an explicit Agg canvas, never pyplot, so
rendering works headless and leaves the user's global matplotlib backend alone.
"""
from __future__ import annotations

import io
import math
from typing import Any, Mapping, Optional, Sequence

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, ScalarFormatter

from trainforge.metrics_file import Series, metric_series  # noqa: F401  (re-exported: the charts' input)
from trainforge.tasks import TASKS

_DPI = 100
_LINE_FIGSIZE_IN = (6.4, 3.6)
_MARKERS_UP_TO_POINTS = 30  # a line through 1-2 points is invisible; show markers for short runs
_ANNOTATE_UP_TO_CLASSES = 20  # beyond this the cell counts are unreadable
_MAX_TICK_LABELS = 40
_MIB = 2**20
_GIB = 2**30


def drawable(text: Any) -> str:
    """A name a user or a file gave, as text the font renderer takes: a lone surrogate (an undecodable byte of a
    file name) becomes its escape, \\udcff, rather than an error that would fail the whole report."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def line_chart_png(title: str, ylabel: str, series: Mapping[str, Series], logy: bool = False,
                   ylim: Optional[tuple[float, float]] = None, plain_y: bool = False) -> bytes:
    """One chart with a line per named series, x = optimizer step."""
    return _png(line_chart(title, ylabel, series, logy=logy, ylim=ylim, plain_y=plain_y))


def line_chart(title: str, ylabel: str, series: Mapping[str, Series], logy: bool = False,
               ylim: Optional[tuple[float, float]] = None, plain_y: bool = False,
               marks: Sequence[tuple[float, str]] = (), colors: Sequence[str] = (),
               line_ids: Sequence[str] = ()) -> Figure:
    """`line_chart_png`'s figure. `plain_y`: y tick labels as plain numbers, never an offset (+3.072e4) or
    a power of ten beside the axis, which readers miss and then misread every tick. `marks`: (step, text)
    events drawn as labelled vertical lines. `colors` and `line_ids`, when given, one per series: its line's
    color (the same run in the same color on every chart) and its id in SVG output (`svg_element`)."""
    fig = Figure(figsize=_LINE_FIGSIZE_IN, dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for step, text in marks:
        ax.axvline(step, color="tab:red", linestyle=":", linewidth=1)
        ax.annotate(text, (step, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -3),
                    textcoords="offset points", va="top", fontsize=7, color="tab:red")
    lines = []
    for i, (label, (steps, values)) in enumerate(series.items()):
        marker = "o" if len(steps) <= _MARKERS_UP_TO_POINTS else None
        lines += ax.plot(steps, values, label=drawable(label), marker=marker, markersize=3, linewidth=1.5,
                         color=colors[i] if colors else None, gid=line_ids[i] if line_ids else None)
    if logy:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    if plain_y:
        formatter = ScalarFormatter(useOffset=False)
        formatter.set_scientific(False)
        ax.yaxis.set_major_formatter(formatter)
    ax.set_title(drawable(title))
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(series) > 1:
        # labels may be anyone's run names: the handles given, so a label starting with "_" is not dropped, and
        # taken as plain text, so "$" is not TeX (a bad formula would fail the drawing)
        for text in ax.legend(handles=lines).get_texts():
            text.set_parse_math(False)
    return fig


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
    names = [drawable(class_names[i]) for i in ticks]
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
    return [(title, _png(fig)) for title, fig in training_figures(rows)]


def training_figures(rows: Sequence[Mapping]) -> list[tuple[str, Figure]]:
    """`training_charts` before rendering: the matplotlib figures."""
    charts: list[tuple[str, Figure]] = []

    def add(title: str, ylabel: str, named: Mapping[str, Series], **kwargs) -> None:
        present = {label: s for label, s in named.items() if s[0]}
        if present:
            charts.append((title, line_chart(title, ylabel, present, **kwargs)))

    add("Loss", "loss", {"train": metric_series(rows, "train", "loss"), "val": metric_series(rows, "val", "loss")},
        marks=micro_batch_changes(rows))
    add("Validation accuracy and macro-F1", "score",
        {"accuracy": metric_series(rows, "val", "accuracy"), "macro_f1": metric_series(rows, "val", "macro_f1")},
        ylim=(0.0, 1.02))
    add("Validation perplexity", "perplexity", {"perplexity": metric_series(rows, "val", "perplexity")}, logy=True)
    for task in map(TASKS.get, TASKS.names()):  # a task's own fractions (a detector's mAP, a segmenter's mIoU), where rows have them
        if task.chart_metrics:
            add(f"Validation {', '.join(task.chart_metrics)}", "score",
                {m: metric_series(rows, "val", m) for m in task.chart_metrics}, ylim=(0.0, 1.02))
    add("Learning rate", "lr", {"lr": metric_series(rows, "train", "lr")})
    add("Throughput", "samples/s", {"samples/s": metric_series(rows, "train", "samples_per_s")})
    memory = metric_series(rows, "train", "peak_mem_bytes")
    if any(v > 0 for v in memory[1]):  # all zeros means the device did not report memory
        # GiB from 1 GiB up, else MiB; from zero, with plain ticks: "30.5" on a GiB axis, not "+3.072e4"
        unit, unit_bytes = ("GiB", _GIB) if max(memory[1]) >= _GIB else ("MiB", _MIB)
        values = [v / unit_bytes for v in memory[1]]
        add("Peak memory", unit, {"peak memory": (memory[0], values)}, ylim=(0.0, 1.1 * max(values)), plain_y=True)
    return charts


def pr_curves_png(recall: Sequence[float], precision: Mapping[str, Sequence[Optional[float]]], title: str) -> bytes:
    """Precision against recall, a line per class (a None precision: recall never reached, not drawn)."""
    def draw(ax: Any) -> None:
        for name, values in precision.items():
            points = [(r, p) for r, p in zip(recall, values) if p is not None]
            if points:
                ax.plot(*zip(*points), linewidth=1.5, label=drawable(name))

    return _curves_png(draw, "recall", "precision", title, bool(precision))


def roc_curves_png(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], title: str) -> bytes:
    """True against false positive rate, a line per class, with the chance diagonal."""
    def draw(ax: Any) -> None:
        ax.plot([0, 1], [0, 1], linestyle=":", color="grey", linewidth=1)
        for name, (fpr, tpr) in curves.items():
            ax.step(fpr, tpr, where="post", linewidth=1.5, label=drawable(name))

    return _curves_png(draw, "false positive rate (1 - specificity)", "true positive rate (sensitivity)", title,
                       bool(curves))


def _curves_png(draw: Any, xlabel: str, ylabel: str, title: str, legend: bool) -> bytes:
    """A chart of rates in [0, 1] on both axes, its lines drawn by `draw(ax)`, a legend of class names."""
    fig = Figure(figsize=(5.2, 4.2), dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    draw(ax)
    ax.set_xlim(0.0, 1.0)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(drawable(title))
    ax.grid(True, alpha=0.3)
    if legend:
        for text in ax.legend(fontsize=8).get_texts():  # class names as plain text, never TeX
            text.set_parse_math(False)
    return _png(fig)


def micro_batch_changes(rows: Sequence[Mapping]) -> list[tuple[float, str]]:
    """(step, "micro-batch 16 -> 8") wherever the train rows' micro-batch changed (out-of-memory recovery, a
    resume on another world size): the loss curve may bend there."""
    marks, previous = [], None
    for row in rows:
        if row.get("split") != "train" or "micro_batch_size" not in row:
            continue
        micro = row["micro_batch_size"]
        if previous is not None and micro != previous:
            marks.append((float(row["step"]), f"micro-batch {previous} -> {micro}"))
        previous = micro
    return marks


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return buf.getvalue()


def svg_element(fig: Figure) -> str:
    """The figure as an `<svg>` element to put inside an HTML page: its lines are elements of the page (an
    artist's gid becomes its group's id) and its text is text, escaped by matplotlib's XML writer."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as <text>, not as glyph outlines
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # without the XML declaration and DOCTYPE, which HTML does not take
