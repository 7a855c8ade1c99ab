"""CenterPoint's targets, loss and decoding (tasks/centers3d.py, issue 52): a perfect head's maps decode back to the
boxes (centres and sizes within 1 cm, yaw within 1e-3); the focal loss is CenterNet's, computed directly; boxes off
the grid are left out."""
from __future__ import annotations

import math

import numpy as np
import torch

from lidar_data import CLASSES, make_scenes
from trainforge.tasks.centers3d import (Grid, center_loss, center_targets, decode, focal_loss, gaussian_radius,
                                        maps_of)

GRID = Grid((0.0, -25.6, -3.0, 40.96, 25.6, 1.0), (0.32, 0.32, 4.0), stride=2)


def test_a_perfect_heads_maps_decode_to_the_boxes():
    for scene in make_scenes(4, seed=6):
        labels = np.array([CLASSES.index(n) for n in scene.names])
        t = center_targets(scene.boxes, labels, 3, GRID, max_objects=16)
        assert t.mask.sum() == len(scene.boxes) and t.heatmap.shape == (3, 80, 64)
        assert all(t.heatmap[l].reshape(-1)[i] == 1 for l, i in zip(labels, t.index[: len(labels)]))
        boxes, scores, found = decode(maps_of(t, GRID), GRID)
        assert len(boxes) == len(scene.boxes) and np.all(scores > 0.99)
        order = [int(np.argmin(np.hypot(*(boxes[:, :2] - b[:2]).T))) for b in scene.boxes]
        got = boxes[order]
        assert np.abs(got[:, :6] - scene.boxes[:, :6]).max() < 0.01
        yaw_error = np.abs(np.arctan2(np.sin(got[:, 6] - scene.boxes[:, 6]), np.cos(got[:, 6] - scene.boxes[:, 6])))
        assert yaw_error.max() < 1e-3 and found[order].tolist() == labels.tolist()


def test_boxes_off_the_grid_and_beyond_max_objects_are_left_out():
    boxes = np.array([[10, 0, -1, 4, 2, 1.5, 0], [50, 0, -1, 4, 2, 1.5, 0], [20, 5, -1, 4, 2, 1.5, 0],
                      [30, -5, -1, 4, 2, 1.5, 0]])
    t = center_targets(boxes, [0, 0, 1, 2], 3, GRID, max_objects=2)
    assert t.mask.tolist() == [1, 1] and t.heatmap[2].max() == 0  # the 50 m box is off the grid; the 4th no slot
    assert t.heatmap[1].max() == 1


def test_centernets_radius_and_focal_loss():
    # a 4 m x 2 m car on 0.64 m cells: CenterNet's three cases (its code halves each root, whatever a is)
    h, w, o = 4 / 0.64, 2 / 0.64, 0.1
    roots = [((b + math.sqrt(b * b - 4 * a * c)) / 2) for a, b, c in
             ((1, h + w, w * h * (1 - o) / (1 + o)), (4, 2 * (h + w), (1 - o) * w * h), (4 * o, -2 * o * (h + w), (o - 1) * w * h))]
    assert gaussian_radius(h, w) == min(roots) and 1 < min(roots) < 3
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, 6)
    target = torch.rand(2, 3, 5, 6) * 0.9
    target[0, 1, 2, 3] = target[1, 0, 4, 5] = 1.0
    p = torch.sigmoid(logits)
    pos = target == 1
    want = (-(torch.log(p) * (1 - p) ** 2)[pos].sum()
            - (torch.log(1 - p) * p ** 2 * (1 - target) ** 4)[~pos].sum()) / 2
    assert torch.allclose(focal_loss(logits, target), want, atol=1e-5)


def test_the_loss_is_near_zero_for_a_perfect_head_and_grows_with_error():
    scene = make_scenes(1, seed=8)[0]
    labels = np.array([CLASSES.index(n) for n in scene.names])
    t = center_targets(scene.boxes, labels, 3, GRID, max_objects=16)
    perfect = {k: torch.from_numpy(v)[None] for k, v in maps_of(t, GRID, confident=12.0).items()}
    batch = [torch.from_numpy(a)[None] for a in (t.heatmap, t.index, t.mask, t.regression)]
    good = center_loss(perfect, *batch)
    assert good["regression"] < 1e-6
    worse = dict(perfect, size=perfect["size"] + 0.2)
    assert center_loss(worse, *batch)["regression"] > good["regression"] + 0.01


def test_a_box_and_its_turn_by_pi_share_the_axis_target_and_differ_in_direction():
    """The footprint of yaw and yaw + pi is one: the regressed axis (sin, cos of 2 yaw) is the same for both, so it
    is learnable from points that do not show the front; the direction classifier's target tells them apart."""
    for yaw in (0.3, -1.2, 2.9, math.pi / 2, -math.pi / 2 + 1e-3):
        a = center_targets(np.array([[10.0, 0, -1, 4, 2, 1.5, yaw]]), [0], 3, GRID, max_objects=1)
        b = center_targets(np.array([[10.0, 0, -1, 4, 2, 1.5, yaw + math.pi]]), [0], 3, GRID, max_objects=1)
        assert np.allclose(a.regression[0, :8], b.regression[0, :8], atol=1e-6)
        assert a.regression[0, 8] + b.regression[0, 8] == 1.0
        for t, want in ((a, yaw), (b, yaw + math.pi)):
            boxes, _, _ = decode(maps_of(t, GRID), GRID)
            assert abs(math.remainder(boxes[0, 6] - want, 2 * math.pi)) < 1e-5
