"""The console summary of the data (one line, warnings, --json counts), from reports of real small files."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from data_helpers import data_cfg, write_png
from trainforge.data import build_data
from trainforge.data.summary import DROP_WARN_FRACTION, MIN_CLASS_SAMPLES, DataSummary, summarize


def write_csv(path: Path, labels: list[str]) -> Path:
    rng = np.random.default_rng(0)
    rows = [f"{rng.random():.6f},{rng.random():.6f},{label}" for label in labels]
    path.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    return path


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def summary_of(cfg) -> DataSummary:
    report = build_data(cfg, seed=0).report
    return summarize(json.loads(json.dumps(report)))  # as read back from data_report.json


def test_csv_with_a_class_missing_from_classes_warns_and_names_the_label(tmp_path):
    # 3 classes x 40 rows, `classes` lists two of them: a third of the file goes as bad_label
    path = write_csv(tmp_path / "iris.csv", ["setosa", "versicolor", "virginica"] * 40)
    s = summary_of(data_cfg("csv", path=str(path), args={"classes": ["setosa", "versicolor"]}))
    assert s.line == "data: 120 rows read, 80 kept, dropped 40 (bad_label 40); splits train 52 / val 12 / test 16"
    assert len(s.warnings) == 1
    assert s.warnings[0].startswith("data: 33.3% of the 120 rows read were dropped (bad_label 40)")
    assert "labels not in data.args.classes: 'virginica' (40 rows)" in s.warnings[0]
    assert s.counts["rows_read"] == 120 and s.counts["rows_kept"] == 80 and s.counts["dropped_total"] == 40
    assert s.counts["dropped"]["bad_label"] == 40 and s.counts["splits"] == {"train": 52, "val": 12, "test": 16}
    assert s.counts["warnings"] == list(s.warnings)
    json.dumps(s.counts)


def test_jsonl_duplicates_and_labels_seen_once_warn(tmp_path):
    records = [{"text": f"review number {i % 60}", "label": ["pos", "neg"][i % 2]} for i in range(120)]
    records.append({"text": "a lone review", "label": "Pos"})  # a typo: a class of its own
    path = write_jsonl(tmp_path / "reviews.jsonl", records)
    s = summary_of(data_cfg("jsonl", path=str(path), args={"seq_len": 16}))
    assert s.line == "data: 121 rows read, 61 kept, dropped 60 (duplicate 60); splits train 40 / val 9 / test 12"
    drop, once = s.warnings
    assert drop.startswith("data: 49.6% of the 121 rows read were dropped (duplicate 60)")
    assert "labels not in" not in drop
    assert once.startswith("data: 1 label(s) appear only once and each became a class of its own ('Pos')")
    assert "data.args.classes is not set" in once
    # the class seen once is not also reported as a small class
    assert not any("fewer than" in w for w in s.warnings)


def test_jsonl_report_lists_classes_seen_once_only_when_classes_are_inferred(tmp_path):
    records = [{"text": f"t{i}", "label": "a" if i < 10 else "b"} for i in range(20)] + [{"text": "x", "label": "c"}]
    path = write_jsonl(tmp_path / "t.jsonl", records)
    inferred = build_data(data_cfg("jsonl", path=str(path)), seed=0).report
    assert inferred["classes_declared"] is False and inferred["classes_seen_once"] == ["c"]
    declared = build_data(data_cfg("jsonl", path=str(path), args={"classes": ["a", "b"]}), seed=0).report
    assert declared["classes_declared"] is True and "classes_seen_once" not in declared
    assert declared["labels_not_in_classes"] == {"c": 1}


def test_image_folder_with_corrupt_files(image_tree):
    s = summary_of(data_cfg("imagefolder", path=str(image_tree), args={"image_size": 8}))
    assert s.line == ("data: 21 rows read, 18 kept, dropped 3 (duplicate 1, corrupt 2); "
                      "splits train 11 / val 3 / test 4")
    assert len(s.warnings) == 1 and s.warnings[0].startswith("data: 14.3% of the 21 rows read were dropped")


def test_small_and_empty_classes_warn(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["a"] * 30 + ["b"] * 30 + ["c"] * 3)
    s = summary_of(data_cfg("csv", path=str(path), args={"classes": ["a", "b", "c", "d"]}))
    assert s.warnings == (
        f"data: 2 class(es) with fewer than {MIN_CLASS_SAMPLES} samples: 'd' (0), 'c' (3); "
        "their metrics are unreliable: add samples or merge classes",
    )


def test_clean_data_has_no_warnings(tmp_path):
    path = write_csv(tmp_path / "t.csv", ["a", "b", "c"] * 20)
    s = summary_of(data_cfg("csv", path=str(path), args={"classes": ["a", "b", "c"]}))
    assert s.warnings == () and s.counts["warnings"] == []
    assert s.line == "data: 60 rows read, 60 kept, dropped 0; splits train 39 / val 9 / test 12"
    digits = summary_of(data_cfg("digits"))
    assert digits.warnings == ()
    lm = summary_of(data_cfg("synthetic_text", args={"task": "lm", "num_samples": 40, "seq_len": 8}))
    assert lm.warnings == () and lm.line.startswith("data: 40 rows read, 40 kept, dropped 0; splits train ")


@pytest.mark.parametrize("dropped,warns", [(5, False), (6, True)])
def test_drop_threshold_is_more_than_five_percent(dropped, warns):
    assert DROP_WARN_FRACTION == 0.05
    report = {"rows_read": 100, "rows_kept": 100 - dropped, "dropped": {"duplicate": dropped, "corrupt": 0},
              "splits": {"train": 100 - dropped}}
    assert bool(summarize(report).warnings) is warns


def test_a_report_without_counts_still_summarizes():
    s = summarize({})  # e.g. a custom factory's own DataBundle with an empty report
    assert s.line == "data: 0 rows read, 0 kept, dropped 0" and s.warnings == ()


def test_long_label_lists_are_cut():
    report = {"rows_read": 10, "rows_kept": 10, "dropped": {}, "splits": {"train": 10},
              "classes_declared": False, "classes_seen_once": [f"label{i}" for i in range(12)]}
    (once,) = summarize(report).warnings
    assert "'label4' and 7 more" in once and "label5" not in once
