"""The loop-overhead benchmark runs and reports a sane ratio (its figure lives in docs/benchmarks.md)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "loop_overhead.py"


def test_benchmark_smoke(capsys):
    spec = importlib.util.spec_from_file_location("loop_overhead", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--repeats", "1", "--steps", "20", "--channels", "4,8,16", "--batch-size", "8", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ratio"] > 0
    assert 0.2 < doc["ratio"] < 5  # same model, same data: the two loops are within a small factor


def test_planner_accuracy_benchmark_memory_rows_match():
    spec = importlib.util.spec_from_file_location("planner_accuracy", BENCH.parent / "planner_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.memory_rows()
    assert len(rows) == len(module.MEMORY_CASES)
    assert all(abs(r["ratio"] - 1) <= 0.05 for r in rows), rows
