"""benchmarks/data_throughput.py runs at tiny sizes and reports sane figures (measured ones: docs/benchmarks.md)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "data_throughput.py"


def test_data_throughput_smoke(capsys):
    spec = importlib.util.spec_from_file_location("data_throughput", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--images", "60", "--size", "24", "--classes", "3", "--image-size", "8", "--batch-size", "8",
                      "--workers", "0", "--batches", "4", "--rounds", "3", "--shard-samples", "16", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert 0.2 < doc["ratio"] < 5  # the same per-sample work on both sides: within a small factor
    assert doc["images_per_s"]["trainforge"] > 0 and doc["setup"]["batches_per_round"] == 4
    assert 0.2 < doc["webdataset_ratio"] < 5  # the same images from tar shards
    start = doc["startup_s"]
    assert set(start) == {"torchvision_listing_s", "trainforge_scan_first_s", "trainforge_scan_cached_s",
                          "trainforge_build_data_first_s", "trainforge_build_data_cached_s", "webdataset_prepare_s",
                          "webdataset_build_data_s"}
    assert all(v > 0 for v in start.values())
    assert len(doc["rounds"]) == 3 and {r["first"] for r in doc["rounds"]} == {"trainforge", "torchvision",
                                                                               "webdataset"}
