"""Every drop reason is counted in the report, with example identifiers."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_helpers import data_cfg
from trainforge.config import CleanConfig
from trainforge.data import build_data
from trainforge.data.base import DataInfo
from trainforge.data.stages.clean import clean_tensor_pool, first_occurrences
from trainforge.data.pool import Pool, TensorSamples
from trainforge.errors import UserError


def test_imagefolder_drops_corrupt_and_duplicate_files(image_tree):
    bundle = build_data(data_cfg("imagefolder", path=str(image_tree), args={"image_size": 8}), seed=0)
    report = bundle.report
    assert report["rows_read"] == 21  # 18 good + copy + truncated + fake .jpg; README.txt is not an image
    assert report["dropped"] == {"duplicate": 1, "corrupt": 2, "nonfinite": 0, "bad_label": 0, "empty_text": 0}
    assert report["dropped_examples"]["duplicate"] == ["dog/zz_copy.png"]
    assert sorted(report["dropped_examples"]["corrupt"]) == ["cat/notes.jpg", "fox/truncated.png"]
    assert report["rows_kept"] == 18
    assert report["class_counts"]["train"].keys() == {"cat", "dog", "fox"}
    assert sum(sum(c.values()) for c in report["class_counts"].values()) == 18


def test_imagefolder_keeps_duplicates_when_dedup_off(image_tree):
    cfg = data_cfg("imagefolder", path=str(image_tree), clean={"dedup": False})
    report = build_data(cfg, seed=0).report
    assert report["dropped"]["duplicate"] == 0 and report["rows_kept"] == 19


CSV = """x1,x2,label
1,2,a
3,4,b
nan,1,a
5,inf,b
6,7,zebra
1,2,b
8,9,a
10,11,b
12,13,a
14,15,b
16,17,a
18,19,b
20,21,a
22,23,b
24,25,a
26,27,b
1,2,3,a
"""


def test_csv_counts_nonfinite_bad_label_duplicate_and_corrupt(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(CSV)
    cfg = data_cfg("csv", path=str(path), args={"classes": ["a", "b"]}, val_fraction=0.1, test_fraction=0.1)
    bundle = build_data(cfg, seed=0)
    report = json.loads(json.dumps(bundle.report))
    assert report["dropped"] == {"duplicate": 1, "corrupt": 1, "nonfinite": 2, "bad_label": 1, "empty_text": 0}
    assert report["dropped_examples"] == {
        "corrupt": ["line 18"], "bad_label": ["line 6"], "nonfinite": ["line 4", "line 5"], "duplicate": ["line 7"],
    }
    assert report["rows_read"] == 17 and report["rows_kept"] == 12
    xs = torch.stack([bundle.val[i][0] for i in range(len(bundle.val))] + [bundle.test[i][0] for i in range(len(bundle.test))])
    assert torch.isfinite(xs).all()


def test_csv_keeps_nonfinite_rows_when_asked(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text(CSV)
    cfg = data_cfg("csv", path=str(path), args={"classes": ["a", "b"]}, clean={"drop_nonfinite": False}, normalize="none")
    assert build_data(cfg, seed=0).report["dropped"]["nonfinite"] == 0


def test_csv_non_numeric_column_is_a_user_error(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("size,color,label\n1,red,a\n2,blue,b\n")
    with pytest.raises(UserError, match=r"data.path: column 'color' of d.csv is not numeric \(line 2: 'red'\)"):
        build_data(data_cfg("csv", path=str(path)), seed=0)


def test_jsonl_counts_empty_text_bad_label_and_corrupt(tmp_path):
    path = tmp_path / "d.jsonl"
    good = [json.dumps({"body": f"text number {i}", "y": i % 2}) for i in range(20)]
    bad = [
        json.dumps({"body": "   ", "y": 1}),  # line 21: empty_text
        json.dumps({"body": "", "y": 0}),  # line 22: empty_text
        json.dumps({"body": "fine", "y": 7}),  # line 23: bad_label (not declared)
        json.dumps({"body": "no label"}),  # line 24: bad_label (missing)
        "{not json",  # line 25: corrupt
        json.dumps({"y": 1}),  # line 26: corrupt (no text)
        json.dumps({"body": "text number 3", "y": 1}),  # line 27: duplicate of line 4
    ]
    path.write_text("\n".join(good + bad) + "\n\n")
    cfg = data_cfg("jsonl", path=str(path), args={"text_field": "body", "label_field": "y", "classes": [0, 1]})
    report = build_data(cfg, seed=0).report
    assert report["dropped"] == {"duplicate": 1, "corrupt": 2, "nonfinite": 0, "bad_label": 2, "empty_text": 2}
    assert report["dropped_examples"]["empty_text"] == ["line 21", "line 22"]
    assert report["dropped_examples"]["bad_label"] == ["line 23", "line 24"]
    assert report["dropped_examples"]["corrupt"] == ["line 25", "line 26"]
    assert report["dropped_examples"]["duplicate"] == ["line 27"]
    assert report["rows_read"] == 27 and report["rows_kept"] == 20


def test_nothing_left_is_a_user_error(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "hi", "label": 1}) + "\n")
    with pytest.raises(UserError, match=r"data: no usable samples left .*bad_label': 1"):
        build_data(data_cfg("jsonl", path=str(path), args={"text_field": "text", "classes": ["x"]}), seed=0)


def test_tensor_dedup_hashes_sample_bytes_only_and_keeps_first():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0], [float("nan"), 0.0], [3.0, 4.0]])
    y = torch.tensor([0, 1, 1, 0, 0])  # row 2 repeats row 0 with another label: still a duplicate
    info = DataInfo("classification", "tabular", (2,), "float32", 2)
    pool = Pool(info, TensorSamples(x, y), labels=y.numpy(), rows_read=5)
    pool = clean_tensor_pool(pool, CleanConfig())
    assert pool.samples.ids == ["row 0", "row 1"]
    assert pool.drops.counts["duplicate"] == 2 and pool.drops.counts["nonfinite"] == 1
    assert pool.labels.tolist() == [0, 1]


def test_first_occurrences():
    assert first_occurrences([b"a", b"b", b"a", b"c", b"b"]).tolist() == [True, True, False, True, False]
    assert len(first_occurrences(np.array([], dtype=object))) == 0
