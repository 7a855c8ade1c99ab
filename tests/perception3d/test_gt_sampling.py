"""Ground-truth sampling (issue 52, Build 2): objects of the train split's frames pasted into a training frame with
their points, where their boxes overlap nothing seen from above; the frame's own points inside a pasted box removed;
drawn from the sample's seeded generator, so the same sample of the same epoch is the same frame (a resumed run sees
the same scenes); evaluation frames untouched."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import trainforge
from lidar_data import CLASSES, make_scenes, write_kitti
from trainforge.boxes3d import bev_overlap, points_in_boxes
from trainforge.data import build_data
from trainforge.errors import UserError
from trainforge.points3d import build_object_database, paste_objects

RANGE = [0.0, -25.6, -3.0, 40.96, 25.6, 1.0]


@pytest.fixture(scope="module")
def scenes() -> list:
    return make_scenes(10, seed=3)


def frames_of(scenes) -> list:
    return [(s.points, s.boxes, np.asarray([CLASSES.index(n) for n in s.names])) for s in scenes]


def draw_with(seed: int):
    g = torch.Generator().manual_seed(seed)
    return lambda n, k: torch.randperm(n, generator=g)[:k].numpy()


def test_the_database_holds_each_object_with_its_own_points(scenes):
    database = build_object_database(frames_of(scenes), min_points=5)
    assert len(database.boxes) == len(database.points) == len(database.labels) == len(database.difficulty) > 0
    every = sum(len(s.boxes) for s in scenes)
    assert len(database.boxes) <= every  # those seen by fewer than 5 points are left out
    assert sum(database.counts(3)) == len(database.boxes)
    for box, points in zip(database.boxes, database.points):
        assert len(points) >= 5 and points_in_boxes(points, box[None]).all()
    fewer = build_object_database(frames_of(scenes), min_points=10**6)
    assert len(fewer.boxes) == 0


def test_pasted_objects_overlap_nothing_and_replace_the_points_where_they_land(scenes):
    database = build_object_database(frames_of(scenes[1:]), min_points=5)
    scene = scenes[0]
    labels = np.asarray([CLASSES.index(n) for n in scene.names])
    wanted = {0: 8, 1: 4, 2: 4}
    points, boxes, got, taken = paste_objects(scene.points, scene.boxes, labels, database, wanted, draw_with(0))
    n = len(scene.boxes)
    assert len(taken) > 0 and len(boxes) == n + len(taken) and len(got) == len(boxes)
    assert np.array_equal(boxes[:n], scene.boxes) and np.array_equal(got[n:], database.labels[taken])
    assert all((got == c).sum() <= max(count, (labels == c).sum()) for c, count in wanted.items())
    overlap = bev_overlap(boxes, boxes)
    np.fill_diagonal(overlap, 0)
    assert overlap.max() == 0  # SECOND's collision check: nothing pasted onto anything
    pasted_points = sum(len(database.points[i]) for i in taken)
    own, pasted = points[:len(points) - pasted_points], points[len(points) - pasted_points:]
    assert np.array_equal(pasted, np.concatenate([database.points[i] for i in taken]))
    assert not points_in_boxes(own, boxes[n:]).any()  # the frame's points where an object now stands are gone
    kept = ~points_in_boxes(scene.points, boxes[n:]).any(axis=1)
    assert np.array_equal(own, scene.points[kept])
    again = paste_objects(scene.points, scene.boxes, labels, database, wanted, draw_with(0))
    assert np.array_equal(again[0], points) and np.array_equal(again[3], taken)  # the same draws, the same frame
    other = paste_objects(scene.points, scene.boxes, labels, database, wanted, draw_with(1))
    assert not np.array_equal(other[3], taken)
    full = paste_objects(scene.points, scene.boxes, labels, database, {c: 0 for c in range(3)}, draw_with(0))
    assert len(full[3]) == 0 and full[0] is scene.points  # a frame that holds enough is left as it is


def overrides(root: Path, *extra: str) -> list[str]:
    return ["data.source=kitti", f"data.path={root}", "model.name=pointpillars",
            f"data.args={{point_cloud_range: {RANGE}, voxel_size: [0.64, 0.64, 4], max_points_per_voxel: 8, "
            "max_voxels: [3000, 4000]}", *extra]


def test_training_frames_get_objects_of_the_train_split_and_evaluation_frames_none(tmp_path):
    root = write_kitti(tmp_path / "kitti", make_scenes(12, seed=0))
    cfg = trainforge.load_config(None, overrides(root, "data.augment={gt_sampling: {Car: 6, Pedestrian: 3}}"))
    data = build_data(cfg.data, seed=0)
    plain = build_data(trainforge.load_config(None, overrides(root)).data, seed=0)
    train_files = {data.train.samples.files[int(i)] for i in data.train.indices}
    pasted_any = 0
    for i in range(len(data.train)):
        points, target = data.train[(i, 0)]
        raw_points, raw = plain.train[(i, 0)]
        n = len(raw["boxes"])
        assert torch.equal(target["boxes"][:n], raw["boxes"]) and torch.equal(target["labels"][:n], raw["labels"])
        assert target["pasted"]["boxes"] == len(target["boxes"]) - n
        assert len(target["difficulty"]) == len(target["boxes"])
        pasted_any += target["pasted"]["boxes"]
        again_points, again = data.train[(i, 0)]  # the same sample of the same epoch: the same frame
        assert torch.equal(again_points, points) and torch.equal(again["boxes"], target["boxes"])
    assert pasted_any > 0
    objects = data.train.augment.objects
    assert {int(c) for c in objects.wanted} == {0, 1} and objects.wanted[0] == 6
    database = objects.get()  # built from the train split's frames only
    test_boxes = np.concatenate([data.test.samples.boxes[int(i)] for i in data.test.indices])
    assert not any(np.isclose(database.boxes[:, None, :3], test_boxes[None, :, :3]).all(-1).any(1))
    assert len(train_files) == len(data.train.indices)
    for split in (data.val, data.test):  # evaluation frames are the files' own
        for i in range(len(split)):
            assert "pasted" not in split[i][1]
    with pytest.raises(UserError, match=r"^data.augment.gt_sampling: Van not among data.args.classes") as e:
        build_data(trainforge.load_config(None, overrides(root, "data.augment={gt_sampling: {Van: 2}}")).data, seed=0)
    assert "\n" not in str(e.value)
