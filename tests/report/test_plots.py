from __future__ import annotations

import io

import numpy as np
from matplotlib.image import imread

from trainforge.report.plots import confusion_matrix_png, line_chart_png, metric_series, training_charts

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
