"""Voxelization and the global augmentations of point clouds (trainforge/points3d.py, issue 52), against a plain
Python reference: pillars are the same on every run, each point in its cell's pillar, first points and first
pillars kept; a transform moves points and boxes together and is undone exactly."""
from __future__ import annotations

import numpy as np

from lidar_data import make_scenes
from trainforge.boxes3d import points_in_boxes
from trainforge.points3d import global_transform, grid_size, undo_points, voxelize

RANGE = [0.0, -25.6, -3.0, 40.96, 25.6, 1.0]
VOXEL = [0.32, 0.32, 4.0]


def reference(points, max_points, max_voxels):
    """Pillars by a dict, point by point, in cloud order."""
    pillars: dict[tuple[int, int], list[np.ndarray]] = {}
    for p in points:
        x, y, z = (float(v) for v in p[:3])
        if not (RANGE[0] <= x < RANGE[3] and RANGE[1] <= y < RANGE[4] and RANGE[2] <= z < RANGE[5]):
            continue
        key = (int(np.floor((y - RANGE[1]) / VOXEL[1])), int(np.floor((x - RANGE[0]) / VOXEL[0])))
        if key not in pillars and len(pillars) == max_voxels:
            continue
        pillars.setdefault(key, [])
        if len(pillars[key]) < max_points:
            pillars[key].append(p)
    return pillars


def test_pillars_equal_a_plain_reference_and_the_same_points_give_the_same_pillars():
    points = make_scenes(1, seed=3)[0].points
    for max_points, max_voxels in ((32, 40000), (4, 40000), (8, 500)):
        pillars = voxelize(points, RANGE, VOXEL, max_points, max_voxels)
        want = reference(points, max_points, max_voxels)
        assert [tuple(c) for c in pillars.coords.tolist()] == list(want)  # first-appearance order
        for voxel, count, key in zip(pillars.voxels, pillars.counts, want):
            assert count == len(want[key])
            assert np.array_equal(voxel[:count], np.stack(want[key])) and not voxel[count:].any()
        again = voxelize(points.copy(), RANGE, VOXEL, max_points, max_voxels)
        assert all(np.array_equal(getattr(pillars, k), getattr(again, k)) for k in ("voxels", "coords", "counts"))
    assert grid_size(RANGE, VOXEL) == (128, 160)
    assert pillars.coords[:, 0].max() < 160 and pillars.coords[:, 1].max() < 128 and pillars.dropped_points > 0


def test_a_global_transform_moves_points_and_boxes_together_and_is_undone():
    scene = make_scenes(1, seed=4)[0]
    inside = points_in_boxes(scene.points, scene.boxes)
    points, boxes, record = global_transform(scene.points, scene.boxes, rotation=0.7, scale=1.05, flip_y=True)
    assert np.array_equal(points_in_boxes(points, boxes), inside)  # every point stays in its box
    assert np.allclose(boxes[:, 3:6], scene.boxes[:, 3:6] * 1.05)
    assert np.allclose(undo_points(points, record), scene.points[:, :3], atol=1e-5)
    assert np.array_equal(points[:, 3], scene.points[:, 3])  # intensity untouched
    assert record.as_dict() == {"flip_y": True, "rotation": 0.7, "scale": 1.05}
