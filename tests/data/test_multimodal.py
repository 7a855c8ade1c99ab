"""data.source: multimodal: named inputs per sample, features z-scored on the train split, the missing-modality
policy counted, a column of the wrong type one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from multimodal_data import write_drives
from tests.data.data_helpers import data_cfg
from trainforge.data import build_data
from trainforge.errors import UserError

ARGS = {"images": ["camera"], "features": ["speed", "load"], "categorical": ["weather"], "image_size": 8}


def cfg(path, **args):
    extra = {k: args.pop(k) for k in ("group_by",) if k in args}
    return data_cfg("multimodal", path=str(path), normalize="none", args={**ARGS, **args}, **extra)


def test_a_sample_is_each_image_and_the_features_z_scored_on_the_train_split(tmp_path):
    index = write_drives(tmp_path / "d", 60, seed=0, side=8)
    bundle = build_data(cfg(index), seed=0)
    names = [i.name for i in bundle.info.inputs]
    assert names == ["camera", "features"] and bundle.info.modality == "multimodal"
    x, y = bundle.val[0]
    assert x["camera"].shape == (3, 8, 8) and x["features"].shape == (5,)  # speed, load, 3 weathers one-hot
    assert bundle.preprocess["feature_names"] == ["speed", "load", "weather=fog", "weather=rain", "weather=sun"]
    train = torch.stack([bundle.train[i][0]["features"] for i in range(len(bundle.train))])
    torch.testing.assert_close(train.mean(0), torch.zeros(5), atol=1e-5, rtol=0)  # the train split's statistics
    torch.testing.assert_close(train.std(0, unbiased=False), torch.ones(5), atol=1e-5, rtol=0)
    stats = bundle.preprocess["feature_stats"]
    rows = [line.split(",") for line in index.read_text().splitlines()[1:]]
    speeds = np.asarray([float(r[1]) for r in rows])
    assert stats["mean"][0] != pytest.approx(speeds.mean(), abs=1e-9)  # not fitted on all rows


def test_the_missing_modality_policy_is_counted(tmp_path):
    index = write_drives(tmp_path / "d", 40, seed=1, missing_images=3, missing_features=2, side=8)
    dropped = build_data(cfg(index), seed=0).report
    assert dropped["dropped"]["missing_camera"] == 3 and dropped["dropped"]["missing_features"] == 2
    assert dropped["rows_kept"] == 35
    zero = build_data(cfg(index, missing="zero"), seed=0)
    assert zero.report["missing_modalities"] == {"camera": 3, "features": 2} and zero.report["rows_kept"] == 40
    assert [i.name for i in zero.info.inputs] == ["camera", "features", "present"]
    samples = {}
    for name in ("train", "val", "test"):
        ds = getattr(zero, name)
        for i in range(len(ds)):
            samples[ds.samples.ids[int(ds.indices[i])]] = ds[i][0]
    first = samples["line 2"]  # no camera
    assert first["present"].tolist() == [0.0, 1.0] and float(first["camera"].abs().sum()) == 0
    fourth = samples["line 5"]  # no speed: the features are zero (the train mean), marked missing
    assert fourth["present"].tolist() == [1.0, 0.0] and float(fourth["features"].abs().sum()) == 0


@pytest.mark.parametrize("cell, message", [
    ("fast", r"data.args.features: column 'speed' of index.csv holds 'fast' \(line 3\), not a number"),
])
def test_a_column_of_the_wrong_type_is_one_line(tmp_path, cell, message):
    index = write_drives(tmp_path / "d", 10, seed=2, side=8)
    lines = index.read_text().splitlines()
    parts = lines[2].split(",")
    parts[1] = cell
    lines[2] = ",".join(parts)
    index.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=message) as e:
        build_data(cfg(index), seed=0)
    assert "\n" not in str(e.value)


def test_an_image_column_holding_numbers_and_a_missing_column_are_one_line(tmp_path):
    index = tmp_path / "i.jsonl"
    index.write_text(json.dumps({"camera": 3.5, "speed": 1, "load": 2, "weather": "sun", "label": "go"}) + "\n")
    with pytest.raises(UserError, match=r"data.args.images: column 'camera' of i.jsonl holds 3.5 \(line 1\), not an "
                                        r"image path"):
        build_data(cfg(index), seed=0)
    with pytest.raises(UserError, match=r"data.args: i.jsonl has no column 'radar'"):
        build_data(cfg(index, features=["radar"]), seed=0)
    with pytest.raises(UserError, match=r"data.group_by: i.jsonl has no column 'drive'"):
        build_data(cfg(index, group_by="drive"), seed=0)


def test_a_categorical_column_of_too_many_values_is_one_line(tmp_path):
    index = tmp_path / "i.jsonl"
    index.write_text("".join(json.dumps({"speed": i, "load": 1, "weather": f"id-{i}", "label": str(i % 2)}) + "\n"
                             for i in range(1001)))
    with pytest.raises(UserError, match=r"data.args.categorical: column 'weather' has 1001 distinct values, more "
                                        r"than 1000"):
        build_data(cfg(index, images=[]), seed=0)


def test_rows_of_one_drive_stay_in_one_split(tmp_path):
    index = write_drives(tmp_path / "d", 80, seed=3, side=8)
    bundle = build_data(cfg(index, group_by="drive"), seed=0)
    assert sum(bundle.report["groups_per_split"].values()) == 20  # four rows a drive
