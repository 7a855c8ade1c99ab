from __future__ import annotations

import io
import re

import numpy as np
import pytest
from matplotlib.image import imread

from trainforge.report.plots import (confusion_matrix_png, line_chart_png, metric_series, training_charts,
                                     training_figures)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_metric_series_keeps_last_row_per_step_and_skips_nulls():
    rows = [
        {"split": "train", "step": 1, "loss": 3.0},
        {"split": "train", "step": 2, "loss": 2.0},
        {"split": "val", "step": 2, "loss": 9.0},
        {"split": "train", "step": 3, "loss": None},  # non-finite, written as null
        {"split": "train", "step": 2, "loss": 1.5},  # resumed run re-logs step 2
        {"split": "train", "step": 4, "peak_mem_bytes": 2**21},
    ]
    assert metric_series(rows, "train", "loss") == ([1, 2], [3.0, 1.5])
    assert metric_series(rows, "val", "loss") == ([2], [9.0])
    assert metric_series(rows, "train", "peak_mem_bytes", scale=2**-20) == ([4], [2.0])


def test_charts_are_real_pngs():
    png = line_chart_png("Loss", "loss", {"train": ([1], [2.0])})  # a single point still renders
    assert png.startswith(PNG_SIGNATURE)
    cm = confusion_matrix_png([[5, 1], [0, 3]], ["$5", "<b>"])
    image = imread(io.BytesIO(cm), format="png")
    assert image.ndim == 3 and image.shape[0] > 100


def test_confusion_matrix_with_many_classes_renders():
    n = 60  # beyond the annotation and tick-label limits
    counts = np.eye(n, dtype=np.int64) * 3
    assert confusion_matrix_png(counts, [f"class{i}" for i in range(n)]).startswith(PNG_SIGNATURE)


def test_training_charts_only_for_present_data():
    classification = [
        {"split": "train", "step": s, "loss": 1.0 / s, "lr": 0.1, "samples_per_s": 100.0, "peak_mem_bytes": 0}
        for s in (1, 2)
    ] + [{"split": "val", "step": 2, "loss": 0.6, "accuracy": 0.8, "macro_f1": 0.7}]
    titles = [t for t, _ in training_charts(classification)]
    # peak memory all zero = not measured (CPU): no chart
    assert titles == ["Loss", "Validation accuracy and macro-F1", "Learning rate", "Throughput"]

    lm = [{"split": "train", "step": 1, "loss": 5.0}, {"split": "val", "step": 1, "loss": 4.0, "perplexity": 54.6}]
    assert [t for t, _ in training_charts(lm)] == ["Loss", "Validation perplexity"]
    assert training_charts([]) == []


def _memory_axis(peak_bytes: list[int]):
    rows = [{"split": "train", "step": s + 1, "loss": 1.0, "peak_mem_bytes": b} for s, b in enumerate(peak_bytes)]
    figures = dict(training_figures(rows))
    fig = figures["Peak memory"]
    fig.canvas.draw()  # tick labels and the offset text are only decided when drawn
    return fig.axes[0]


PLAIN_NUMBER = re.compile(r"^\d+(\.\d+)?$")


@pytest.mark.parametrize("peak_bytes, unit, top", [
    # ~30 GiB that barely moves: in MiB around 30720, matplotlib's default axis would say "+3.072e4"
    ([30 * 2**30 + k * 2**20 for k in range(4)], "GiB", 30),
    ([2**30 + 7 * k for k in range(3)], "GiB", 1),  # exactly 1 GiB and up: GiB
    ([500 * 2**20 + k * 2**10 for k in range(4)], "MiB", 500),  # below 1 GiB: MiB
    ([3 * 2**20, 2**21], "MiB", 3),
])
def test_peak_memory_axis_is_mib_or_gib_with_plain_tick_labels(peak_bytes, unit, top):
    ax = _memory_axis(peak_bytes)
    assert ax.get_ylabel() == unit
    assert ax.yaxis.get_offset_text().get_text() == ""  # no "+3.072e4" or "1e4" beside the axis
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3 and all(PLAIN_NUMBER.match(label) for label in labels), labels
    bottom, upper = ax.get_ylim()
    assert bottom == 0 and top < upper < 2 * top  # from zero, with the data (in `unit`) below the top


def test_peak_memory_chart_still_renders_to_png():
    rows = [{"split": "train", "step": s, "peak_mem_bytes": (29 + s) * 2**30} for s in (1, 2)]
    charts = dict(training_charts(rows))
    assert charts["Peak memory"].startswith(PNG_SIGNATURE)


def test_micro_batch_changes_are_marked_on_the_loss_curve():
    from trainforge.report.plots import micro_batch_changes

    rows = [{"split": "train", "step": s, "loss": 1.0 / s, "micro_batch_size": m, "accumulation": 32 // m}
            for s, m in [(1, 32), (2, 32), (3, 16), (4, 16), (5, 8)]]
    rows.insert(2, {"split": "val", "step": 2, "loss": 0.4})
    assert micro_batch_changes(rows) == [(3.0, "micro-batch 32 -> 16"), (5.0, "micro-batch 16 -> 8")]
    loss = dict(training_figures(rows))["Loss"]
    ax = loss.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["micro-batch 32 -> 16", "micro-batch 16 -> 8"]
    assert sorted(line.get_xdata()[0] for line in ax.lines if line.get_linestyle() == ":") == [3.0, 5.0]
    steady = [dict(r, micro_batch_size=32) for r in rows if r["split"] == "train"]
    assert micro_batch_changes(steady) == [] and not dict(training_figures(steady))["Loss"].axes[0].texts


def test_a_detector_and_a_segmenter_get_their_own_metrics_charted():
    """The task's chart_metrics over training (a detector's mAP, a segmenter's mIoU), on a 0..1 axis."""
    detection = [{"split": "train", "step": 1, "loss": 2.0},
                 {"split": "val", "step": 1, "map": 0.1, "map_50": 0.3, "map_75": 0.05, "mar_100": 0.2},
                 {"split": "val", "step": 2, "map": 0.4, "map_50": 0.7, "map_75": 0.35, "mar_100": 0.5}]
    figures = dict(training_figures(detection))
    assert list(figures) == ["Loss", "Validation map, map_50, map_75, mar_100"]
    ax = figures["Validation map, map_50, map_75, mar_100"].axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["map", "map_50", "map_75", "mar_100"]
    assert list(ax.get_lines()[1].get_ydata()) == [0.3, 0.7] and ax.get_ylim() == (0.0, 1.02)
    segmentation = [{"split": "val", "step": 1, "loss": 0.5, "miou": 0.6, "dice": 0.7, "pixel_accuracy": 0.9}]
    assert "Validation miou, dice, pixel_accuracy" in dict(training_figures(segmentation))


def test_pr_curves_png_draws_a_line_per_class_and_skips_unreached_recall():
    from trainforge.report.plots import pr_curves_png

    png = pr_curves_png([0.0, 0.5, 1.0], {"car": [1.0, 0.8, None], "$x$": [None, None, None]}, "PR")
    assert png.startswith(PNG_SIGNATURE)
