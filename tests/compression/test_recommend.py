"""Which variant `compress` recommends and `predict` serves: the rule as a pure function of recorded numbers,
and the table's marks. (The 32x32 grayscale CNN of issue 12 measured int8 at 5.9 ms against fp32's 1.6 ms at
batch 32, and the folder still served int8 as "the most compressed".)"""
from __future__ import annotations

import copy

import pytest

from trainforge.compression.recommend import mark, recommend
from trainforge.compression.render import recommendation_line, report_section, rich_table, rows


def row(name: str, b32_ms: float, size: int, accuracy: float | None = 0.98, path: str | None = None, **extra) -> dict:
    files = {"fp32": "fp32.onnx", "pruned": "pruned.onnx", "int8": "int8.onnx", "pruned+int8": "pruned-int8.onnx"}
    return {"name": name, "path": path or f"/out/{files.get(name, name + '.onnx')}", "params": 1000, "flops": 2000,
            "bytes": size, "latency_ms": {"b1": b32_ms / 20, "b32": b32_ms}, "accuracy": accuracy, **extra}


def test_issue_12_numbers_recommend_fp32_not_the_slower_int8():
    variants = [row("fp32", 1.6, 100_000), row("int8", 5.9, 30_000)]
    rec = recommend(variants)
    assert rec.name == "fp32"
    assert rec.reason.startswith("fp32: no compressed variant within 1 accuracy point of fp32 is faster at batch 32")
    assert "int8 5.900 ms" in rec.reason


def test_the_fastest_within_the_tolerance_is_recommended():
    variants = [row("fp32", 1.6, 100_000), row("pruned", 1.0, 40_000), row("int8", 1.2, 30_000),
                row("pruned+int8", 0.7, 12_000, accuracy=0.96)]  # fastest, but 2 points lost
    rec = recommend(variants)
    assert rec.name == "pruned"
    assert "fastest at batch 32 (1.000 ms, 1.60x fp32)" in rec.reason
    assert "faster but beyond the tolerance: pruned+int8 (+2.00)" in rec.reason
    assert recommend(variants, tolerance_pt=2.0).name == "pruned+int8"
    assert recommend(variants, tolerance_pt=0.0).name == "pruned"  # the pruned model lost nothing


def test_the_tolerance_boundary_counts_as_within():
    variants = [row("fp32", 2.0, 100, accuracy=0.99), row("int8", 1.0, 30, accuracy=0.98)]  # 0.99-0.98: 1.0000000000000009 pt
    assert recommend(variants, tolerance_pt=1.0).name == "int8"
    assert recommend(variants, tolerance_pt=0.99).name == "fp32"


def test_equal_latency_goes_to_the_smaller_file_then_the_earlier_row():
    variants = [row("fp32", 1.6, 100_000), row("pruned", 1.2, 40_000), row("int8", 1.2, 30_000)]
    rec = recommend(variants)
    assert rec.name == "int8" and "as fast as pruned and smaller" in rec.reason
    same_size = [row("fp32", 1.6, 100_000), row("pruned", 1.2, 30_000), row("int8", 1.2, 30_000)]
    assert recommend(same_size).name == "pruned"
    assert recommend([row("fp32", 1.2, 100_000), row("int8", 1.2, 30_000)]).name == "int8"  # as fast, 3x smaller


def test_only_servable_onnx_variants_are_recommended():
    torchao = row("torchao-int8", 0.1, 10_000, path="/out/torchao-int8.pt")
    assert recommend([row("fp32", 1.6, 100_000), torchao]).name == "fp32"


def test_an_unmeasured_metric_is_never_within_the_tolerance():
    assert recommend([row("fp32", 1.6, 100_000), row("int8", 1.0, 30_000, accuracy=None)]).name == "fp32"


def test_language_models_use_the_perplexity_increase_in_percent():
    lm = [row("fp32", 5.0, 100, accuracy=None, perplexity=10.0), row("int8", 4.0, 30, accuracy=None, perplexity=10.05),
          row("pruned+int8", 3.0, 20, accuracy=None, perplexity=10.5)]  # +0.5% and +5%
    rec = recommend(lm)
    assert rec.name == "int8" and "at most 1% above fp32's perplexity" in rec.reason
    assert recommend(lm, tolerance_pt=5.0).name == "pruned+int8"


def test_mark_sets_exactly_one_recommended_and_the_slower_flags():
    variants = [row("fp32", 1.6, 100_000), row("int8", 5.9, 30_000), row("pruned", 1.1, 50_000),
                row("pruned+int8", 1.7, 15_000)]
    original = copy.deepcopy(variants)
    rec = mark(variants)
    assert rec.name == "pruned"
    assert [v["recommended"] for v in variants] == [False, False, True, False]
    assert [v["slower_than_fp32"] for v in variants] == [False, True, False, True]
    assert [{k: v[k] for k in o} for v, o in zip(variants, original)] == original  # nothing else changed


def table_doc() -> dict:
    variants = [row("fp32", 1.6, 100_000), row("int8", 5.9, 30_000)]
    for v in variants:
        v.update(latency_p90_ms=dict(v["latency_ms"]), throughput_per_s={"b32": 32e3 / v["latency_ms"]["b32"]},
                 size_ratio=100_000 / v["bytes"], speedup={"b32": 1.6 / v["latency_ms"]["b32"]},
                 accuracy_delta_pt=0.0)
    rec = mark(variants)
    return {"task": "classification", "threads": 1, "test_samples": 400, "out": "/out", "variants": variants,
            "recommendation": {"variant": rec.name, "file": "fp32.onnx", "reason": rec.reason, "accuracy_tolerance_pt": 1.0}}


def test_the_table_flags_a_variant_slower_than_fp32_and_marks_the_recommended_one():
    from rich.console import Console

    doc = table_doc()
    cells = {r[0]: r for r in rows(doc)}
    assert set(cells) == {"fp32 *", "int8"}
    assert cells["int8"][8] == "0.27x slower" and cells["fp32 *"][8] == "1.00x"
    console = Console(width=200, record=True)
    console.print(rich_table(doc))
    text = console.export_text()
    assert "0.27x slower" in text and "fp32 *" in text
    assert recommendation_line(doc).startswith("* recommended (served by `trainforge predict` on the folder): fp32: ")
    html = report_section(doc)
    assert "0.27x slower" in html and "<td>fp32 *</td>" in html and "* recommended" in html


def test_a_detectors_tolerance_counts_map_50_points():
    """A task whose quality is not accuracy (a detector's mAP@.5) names it: its points decide, not a missing accuracy."""
    variants = [row("fp32", 1900.0, 100_000, accuracy=None, map_50=0.80),
                row("int8", 1300.0, 30_000, accuracy=None, map_50=0.795)]
    assert recommend(variants).name == "fp32"  # without the key: int8's quality is unknown, fp32 is served
    rec = recommend(variants, points="map_50")
    assert rec.name == "int8" and "within 1 map_50 point of fp32" in rec.reason
    variants[1]["map_50"] = 0.78  # 2 points lost
    assert recommend(variants, points="map_50").name == "fp32"


def test_a_detector_is_recommended_by_its_batch_1_latency_as_it_is_served():
    """Issue 55: a detector is served image by image (`Task.served_batch` 1). The recorded run: int8 59.6 ms against
    fp32's 53.3 ms at batch 1, 2,246 against 2,318 ms at batch 32. Batch 32 alone would pick int8; batch 1 says fp32,
    and the table's speedup column is the batch-1 one, flagged slower."""
    from trainforge.compression.recommend import batch_key
    from trainforge.tasks import TASKS

    def measured(name: str, b1: float, b32: float) -> dict:
        r = row(name, b32, 100_000 if name == "fp32" else 30_000, accuracy=None, map_50=0.83)
        r["latency_ms"] = {"b1": b1, "b32": b32}
        return r

    variants = [measured("fp32", 53.3, 2318.0), measured("int8", 59.6, 2246.0)]
    assert recommend(variants, points="map_50").name == "int8"  # the old rule: batch 32
    served = batch_key(TASKS.get("detection").served_batch)
    assert served == "b1" and batch_key(TASKS.get("classification").served_batch) == "b32"
    rec = mark(variants, points="map_50", batch=served)
    assert rec.name == "fp32" and "is faster at batch 1" in rec.reason and "int8 59.600 ms" in rec.reason
    assert [v["slower_than_fp32"] for v in variants] == [False, True]
    for v in variants:
        v.update(params=1000, flops=2000, size_ratio=1.0, latency_p90_ms=v["latency_ms"],
                 throughput_per_s={"b32": 1.0}, speedup={k: variants[0]["latency_ms"][k] / v["latency_ms"][k]
                                                         for k in ("b1", "b32")})
    doc = {"task": "detection", "threads": 1, "test_samples": 8, "variants": variants, "out": "/out",
           "recommendation": {"variant": rec.name, "reason": rec.reason, "points": "map_50", "batch": served}}
    table = rows(doc)
    assert table[1][8] == f"{53.3 / 59.6:.2f}x slower"  # the batch-1 figure the choice was made on
    assert "<th>speedup b1</th>" in report_section(doc)
