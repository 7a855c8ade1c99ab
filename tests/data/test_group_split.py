"""data.group_by: every sample of a group (a patient) in one split, for every source that has columns; the report
counts groups per split; a group column that is not there is one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.data.data_helpers import data_cfg
from trainforge.data import build_data
from trainforge.data.stages.split import group_split, groups_per_split
from trainforge.errors import UserError


def patients(n_patients: int = 40, seed: int = 0) -> list[tuple[str, int, int]]:
    """(patient id, label, a feature) rows: 3-5 rows per patient, one label per patient."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_patients):
        label = p % 2
        for k in range(int(rng.integers(3, 6))):
            rows.append((f"P{p:03d}", label, p * 10 + k))
    return rows


def assert_no_patient_in_two_splits(splits, groups):
    where: dict[str, str] = {}
    for name, idx in splits.items():
        for g in groups[idx]:
            assert where.setdefault(g, name) == name, f"{g} is in {where[g]} and {name}"
    assert sorted(np.concatenate(list(splits.values())).tolist()) == list(range(len(groups)))  # nothing lost
    return where


def test_group_split_keeps_each_group_whole_and_stratifies_by_group_label():
    rows = patients(60)
    groups = np.asarray([r[0] for r in rows], dtype=object)
    labels = np.asarray([r[1] for r in rows])
    splits, method = group_split(labels, groups, 0.15, 0.2, seed=4, column="patient_id")
    where = assert_no_patient_in_two_splits(splits, groups)
    assert method == "grouped by patient_id, stratified"
    per_split = groups_per_split(groups, splits)
    assert per_split == {"train": 39, "val": 9, "test": 12}  # round(0.2 x 60) and round(0.15 x 60) patients
    assert sum(1 for s in where.values() if s == "test") == 12
    for name in ("val", "test"):  # stratified: the held-out patients are half of each label (within one)
        held = {g for g, s in where.items() if s == name}
        ones = sum(int(g[1:]) % 2 for g in held)
        assert abs(ones - len(held) / 2) <= 1
    again, _ = group_split(labels, groups, 0.15, 0.2, seed=4, column="patient_id")
    other, _ = group_split(labels, groups, 0.15, 0.2, seed=5, column="patient_id")
    assert all(np.array_equal(splits[k], again[k]) for k in splits)
    assert not np.array_equal(splits["test"], other["test"])


def test_groups_per_split_refuses_a_group_in_two_splits():
    groups = np.asarray(["a", "a", "b"], dtype=object)
    with pytest.raises(AssertionError, match="group 'a' is in the train and test splits"):
        groups_per_split(groups, {"train": np.array([0, 2]), "test": np.array([1])})


def test_too_few_groups_is_one_line():
    groups = np.asarray(["a", "a", "b", "b"], dtype=object)
    with pytest.raises(UserError, match="data.group_by: only 2 distinct pid values"):
        group_split(None, groups, 0.3, 0.3, seed=0, column="pid")


def write_csv(path, rows, group_column="patient_id"):
    path.write_text(f"{group_column},f,label\n" + "".join(f"{p},{f},{y}\n" for p, y, f in rows))


def test_a_csv_grouped_by_patient_keeps_every_patient_in_one_split(tmp_path):
    rows = patients(40)
    rows.append(("", 1, 999))  # no patient: dropped and counted
    path = tmp_path / "t.csv"
    write_csv(path, rows)
    bundle = build_data(data_cfg("csv", path=str(path), group_by="patient_id", normalize="none"), seed=0)
    assert bundle.info.input_shape == (1,)  # the group column is no feature
    assert bundle.preprocess["feature_names"] == ["f"]
    report = bundle.report
    assert report["dropped"]["missing_group"] == 1
    assert report["group_by"] == "patient_id"
    where: dict[int, str] = {}
    for name in ("train", "val", "test"):
        ds = getattr(bundle, name)
        for i in range(len(ds)):
            x = ds[i][0] if name != "train" else ds[(0, i)][0]
            patient = int(x[0]) // 10  # the feature encodes its patient
            assert where.setdefault(patient, name) == name, f"patient {patient} in {where[patient]} and {name}"
    assert len(where) == 40
    assert report["groups_per_split"] == {name: sum(1 for s in where.values() if s == name)
                                          for name in ("train", "val", "test")}
    assert report["split_method"] == "grouped by patient_id, stratified"


def test_a_jsonl_grouped_by_a_record_key(tmp_path):
    rows = patients(30, seed=1)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"text": f"note {f}", "label": str(y), "pid": p}) + "\n" for p, y, f in rows)
                    + json.dumps({"text": "no patient", "label": "1"}) + "\n")
    bundle = build_data(data_cfg("jsonl", path=str(path), group_by="pid", normalize="none"), seed=3)
    assert bundle.report["dropped"]["missing_group"] == 1
    assert sum(bundle.report["groups_per_split"].values()) == 30
    assert sum(bundle.report["splits"].values()) == len(rows)


@pytest.mark.parametrize("source", ["csv", "jsonl"])
def test_a_group_column_that_is_not_there_is_one_line(tmp_path, source):
    path = tmp_path / ("t.csv" if source == "csv" else "t.jsonl")
    if source == "csv":
        write_csv(path, patients(10))
    else:
        path.write_text("".join(json.dumps({"text": "a b", "label": str(i % 2)}) + "\n" for i in range(20)))
    with pytest.raises(UserError, match=r"data.group_by: t\.(csv|jsonl) has no column 'patient' \(columns: .*"
                                        r"\); set it to the column"):
        build_data(data_cfg(source, path=str(path), group_by="patient"), seed=0)


def test_a_source_without_columns_refuses_group_by():
    with pytest.raises(UserError, match="data.group_by: data.source 'digits' has no columns to group by"):
        build_data(data_cfg("digits", group_by="patient_id"), seed=0)


def test_an_image_folder_index_grouped_by_patient(tmp_path):
    """imagefolder's data.path may be an index (path,label,patient_id): every patient's images in one split; a
    path leaving the index's folder is refused."""
    from PIL import Image

    rng = np.random.default_rng(0)
    rows = ["path,label,patient_id"]
    for p in range(20):
        for k in range(int(rng.integers(3, 6))):
            rel = f"p{p}/img{k}.png"
            (tmp_path / f"p{p}").mkdir(exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(tmp_path / rel)
            rows.append(f"{rel},{('benign', 'malignant')[p % 2]},patient-{p}")
    rows.append("p0/missing.png,benign,patient-0")  # not there: corrupt
    rows.append("p1/img0.png,benign,")  # no patient
    index = tmp_path / "index.csv"
    index.write_text("\n".join(rows) + "\n")
    bundle = build_data(data_cfg("imagefolder", path=str(index), group_by="patient_id", args={"image_size": 8}),
                        seed=0)
    assert bundle.info.class_names == ("benign", "malignant")
    assert bundle.report["dropped"]["corrupt"] == 1 and bundle.report["dropped"]["missing_group"] == 1
    where: dict[str, str] = {}
    for name in ("train", "val", "test"):
        ds = getattr(bundle, name)
        for i in ds.indices:
            patient = ds.samples.ids[int(i)].split("/")[0]
            assert where.setdefault(patient, name) == name, f"{patient} in {where[patient]} and {name}"
    assert len(where) == 20 and sum(bundle.report["groups_per_split"].values()) == 20
    x, _ = bundle.test[0]
    assert x.shape == (3, 8, 8)
    index.write_text("path,label\n../outside.png,benign\n")
    with pytest.raises(UserError, match=r"index.csv line 2: '../outside.png' is outside the index's folder"):
        build_data(data_cfg("imagefolder", path=str(index)), seed=0)
