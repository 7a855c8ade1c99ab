"""`trainforge compress` end to end on the two target recipes: the before/after table and its targets.

Sizes and accuracies are asserted; times only for being measured (a shared machine's latency is noise).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import trainforge
from trainforge.cli import main

pytestmark = pytest.mark.slow
NAMES = ["fp32", "pruned", "int8", "pruned+int8"]


def compress_json(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", *args, "--json"])
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err
    return json.loads(captured.out)


def copy_run(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / run.name
    shutil.copytree(run, dst)
    return dst


@pytest.mark.parametrize("fixture, method", [("digits_run", "static"), ("text_run", "dynamic")])
def test_compress_meets_the_targets(fixture, method, request, tmp_path, capsys):
    run = copy_run(request.getfixturevalue(fixture), tmp_path)
    doc = compress_json(capsys, str(run), "--prune", "0.5", "--finetune-epochs", "1", "--distill",
                        "--bench-seconds", "0.2")
    v = {row["name"]: row for row in doc["variants"]}
    assert list(v) == NAMES
    assert doc["int8_method"] == method, "static QDQ for the CNN, dynamic for the Transformer"
    for row in v.values():  # the JSON contract
        assert {"name", "path", "params", "bytes", "latency_ms", "accuracy"} <= set(row)
        assert Path(row["path"]).stat().st_size == row["bytes"]
        for b in ("b1", "b32"):
            assert row["latency_ms"][b] > 0 and row["latency_p90_ms"][b] >= row["latency_ms"][b]
            assert row["throughput_per_s"][b] > 0
    # export: the fp32 artifact reproduces PyTorch on the test split
    assert v["fp32"]["max_abs_diff"] < 1e-4 and v["pruned"]["max_abs_diff"] < 1e-4
    # int8: at least 3.5x smaller than fp32 ONNX, at most 1 point of accuracy lost
    assert v["fp32"]["bytes"] / v["int8"]["bytes"] >= 3.5
    assert v["int8"]["accuracy"] >= v["fp32"]["accuracy"] - 0.01
    assert v["int8"]["speedup"]["b32"] > 0
    # exactly one recommended: the fastest at batch 32 of those within 1 point (timings decide which)
    eligible = [r for r in v.values() if r["accuracy"] >= v["fp32"]["accuracy"] - 0.01 - 1e-12]
    assert [r["name"] for r in v.values() if r["recommended"]] == [doc["recommendation"]["variant"]]
    assert v[doc["recommendation"]["variant"]]["latency_ms"]["b32"] == min(r["latency_ms"]["b32"] for r in eligible)
    # pruning removed channels for real; fine-tuning (distilled) ran through the training loop
    assert v["pruned"]["params"] < v["fp32"]["params"] and v["pruned"]["flops"] < v["fp32"]["flops"]
    assert v["pruned"]["bytes"] < v["fp32"]["bytes"]
    assert v["pruned+int8"]["bytes"] < v["int8"]["bytes"]
    assert v["pruned"]["accuracy"] >= v["fp32"]["accuracy"] - 0.05, "fine-tuning recovers the pruned model"
    ft = doc["finetune"]
    assert ft["distill"] and ft["steps"] > 0 and (Path(ft["run_dir"]) / "metrics.jsonl").is_file()
    # everything lands in the run: the table as JSON and a report section
    assert json.loads((run / "compressed" / "compress.json").read_text())["variants"] == doc["variants"]
    html = (run / "report.html").read_text()
    assert "<h2>Compression</h2>" in html and "pruned+int8" in html


def test_an_interrupted_compression_continues(digits_run, tmp_path, monkeypatch, capsys):
    """A crash after fine-tuning (here: in quantization) loses nothing: the rerun continues the same --out."""
    import trainforge.compression.pipeline as pipeline

    run = copy_run(digits_run, tmp_path)
    real = pipeline.quantize_onnx

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(pipeline, "quantize_onnx", crash)
    with pytest.raises(RuntimeError):
        pipeline.compress(run, options=pipeline.CompressOptions(prune=0.5, finetune_epochs=1, bench_s=0.05, progress=False))
    out = run / "compressed"
    steps_before = [json.loads(line)["step"] for line in (out / "finetune" / "metrics.jsonl").read_text().splitlines()]
    assert not (out / "compress.json").exists()

    monkeypatch.setattr(pipeline, "quantize_onnx", real)
    doc = trainforge.compress(run, prune=0.5, finetune_epochs=1, bench_s=0.05, progress=False)  # the Python API
    assert [row["name"] for row in doc["variants"]] == NAMES
    steps_after = [json.loads(line)["step"] for line in (out / "finetune" / "metrics.jsonl").read_text().splitlines()]
    assert steps_after == steps_before, "the finished fine-tuning is not run again"
    # the fine-tuning run is a run like any other: `trainforge eval` rebuilds the pruned model from its weights
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", doc["finetune"]["run_dir"], "--json"])
    assert exit_info.value.code in (0, None)
    pruned = next(r for r in doc["variants"] if r["name"] == "pruned")
    assert abs(json.loads(capsys.readouterr().out)["accuracy"] - pruned["accuracy"]) < 1e-9, "PyTorch and ONNX agree"
    # and a finished compression is never overwritten
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", str(run)])
    assert exit_info.value.code == 2
    assert "finished compression" in capsys.readouterr().err
