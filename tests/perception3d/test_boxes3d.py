"""3D box geometry (trainforge/boxes3d.py, issue 52): rotated BEV IoU against shapely's polygon intersection, 3D
IoU, KITTI camera boxes to the LiDAR frame and back, points in boxes, KITTI's difficulty levels, calibration files."""
from __future__ import annotations

import numpy as np
import pytest
from shapely.geometry import Polygon

from trainforge.boxes3d import (Calibration, CalibrationError, bev_iou, camera_to_lidar, corners_3d, corners_bev,
                                format_kitti_calib, iou_3d, kitti_difficulty, lidar_to_camera, parse_kitti_calib,
                                points_in_boxes)


def random_boxes(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.column_stack([rng.uniform(-3, 3, (n, 2)), rng.uniform(-1, 1, n), rng.uniform(0.3, 5, (n, 3)),
                            rng.uniform(-np.pi, np.pi, n)])


def shapely_iou(a: np.ndarray, b: np.ndarray) -> float:
    pa, pb = Polygon(corners_bev(a)[0]), Polygon(corners_bev(b)[0])
    return pa.intersection(pb).area / pa.union(pb).area


def test_rotated_bev_iou_equals_shapelys_polygon_intersection_on_1000_random_pairs():
    rng = np.random.default_rng(0)
    a, b = random_boxes(rng, 1000), random_boxes(rng, 1000)
    b[:50] = a[:50]                                                # the same box
    b[50:100, :6], b[50:100, 6] = a[50:100, :6], a[50:100, 6] + np.pi  # turned half round: the same rectangle
    b[100:150, :6], b[100:150, 6] = a[100:150, :6], a[100:150, 6] + np.pi / 2
    b[150:200, :2] = a[150:200, :2] + 8.0                          # apart (each fits in a 7.1 m circle)
    want = np.array([shapely_iou(a[i], b[i]) for i in range(1000)])
    got = np.diag(bev_iou(a, b))
    assert np.abs(got - want).max() < 1e-6
    assert (want > 0).sum() > 500 and (want == 0).sum() > 50      # the pairs overlap and miss alike
    assert np.allclose(got[:100], 1.0) and np.all(got[150:200] == 0)
    # the (N, M) matrix, each pair as alone
    full = bev_iou(a[:40], b[:30])
    assert np.abs(full - np.array([[shapely_iou(a[i], b[j]) for j in range(30)] for i in range(40)])).max() < 1e-6


def test_3d_iou_is_the_bev_overlap_times_the_height_overlap():
    box = np.array([[0, 0, 0, 4, 2, 2, 0.3]])
    assert iou_3d(box, box)[0, 0] == pytest.approx(1.0)
    up = box.copy()
    up[0, 2] += 1  # half the height shared: 4 of 16 + 16 - 8
    assert iou_3d(box, up)[0, 0] == pytest.approx(8 / 24)
    up[0, 2] += 2
    assert iou_3d(box, up)[0, 0] == 0 and bev_iou(box, up)[0, 0] == pytest.approx(1.0)
    assert iou_3d(np.zeros((0, 7)), box).shape == (0, 1)


def kitti_calibration() -> Calibration:
    """KITTI's usual extrinsics (camera z = LiDAR x, camera x = -LiDAR y, camera y = -LiDAR z) with a small
    rotation and offset, and a rectifying rotation: as a real calib file holds them."""
    base = np.array([[0.0, -1, 0], [0, 0, -1], [1, 0, 0]])
    tilt = np.array([[1, 0, 0], [0, np.cos(0.01), -np.sin(0.01)], [0, np.sin(0.01), np.cos(0.01)]])
    velo = np.column_stack([tilt @ base, [0.02, -0.08, -0.27]])
    r0 = np.array([[np.cos(0.005), 0, np.sin(0.005)], [0, 1, 0], [-np.sin(0.005), 0, np.cos(0.005)]])
    p2 = np.array([[721.5, 0, 609.6, 44.9], [0, 721.5, 172.9, 0.2], [0, 0, 1, 0.003]])
    return Calibration(P2=p2, R0_rect=r0, Tr_velo_to_cam=velo)


def test_a_kitti_camera_box_turns_into_the_lidar_frame_and_back():
    calib = kitti_calibration()
    boxes = np.array([[10.0, 2.0, -0.9, 4.0, 1.8, 1.5, 0.4], [25.0, -6.0, -0.7, 0.8, 0.6, 1.8, -2.9]])
    label = lidar_to_camera(boxes, calib)
    assert np.allclose(camera_to_lidar(label, calib), boxes, atol=1e-9)
    # the camera's bottom centre is below the LiDAR centre by h/2, and rotation_y is about the camera's down axis
    bottom = boxes[:, :3] - np.column_stack([np.zeros((2, 2)), boxes[:, 5] / 2])
    assert np.allclose(label[:, 3:6], calib.lidar_to_rect(bottom))
    plain = Calibration(P2=calib.P2, R0_rect=np.eye(3), Tr_velo_to_cam=np.column_stack([
        [[0.0, -1, 0], [0, 0, -1], [1, 0, 0]], np.zeros(3)]))
    # a car ahead (camera z) facing right (camera x, rotation_y = 0) heads along -LiDAR y: yaw -pi/2
    (box,) = camera_to_lidar(np.array([[1.5, 1.8, 4.0, 0.0, 1.0, 10.0, 0.0]]), plain)
    assert np.allclose(box, [10.0, 0.0, -1.0 + 0.75, 4.0, 1.8, 1.5, -np.pi / 2])
    # its eight corners land where the camera's box has them: the front face (along its heading) at camera x = +2
    front = corners_3d(box[None])[0][[0, 1, 4, 5]]
    assert np.allclose(plain.lidar_to_rect(front)[:, 0], 2.0)


def test_points_in_boxes_follows_the_heading():
    box = np.array([[5.0, 0.0, 0.0, 4.0, 1.0, 2.0, np.pi / 2]])  # 4 m long along y
    points = np.array([[5.0, 1.9, 0.0], [5.0, 2.1, 0.0], [6.9, 0.0, 0.0], [5.4, 0.0, 0.9], [5.0, 0.0, 1.1]])
    assert points_in_boxes(points, box)[:, 0].tolist() == [True, False, False, True, False]


def test_kitti_difficulty_levels_from_height_occlusion_and_truncation():
    height = np.array([50, 50, 30, 30, 30, 20, 50])
    occlusion = np.array([0, 1, 0, 2, 3, 0, 0])
    truncation = np.array([0.1, 0.1, 0.1, 0.4, 0.1, 0.0, 0.6])
    assert kitti_difficulty(height, occlusion, truncation).tolist() == [0, 1, 1, 2, -1, -1, -1]


def test_calibration_files_round_trip_and_bad_ones_say_why():
    calib = kitti_calibration()
    again = parse_kitti_calib(format_kitti_calib(calib))
    assert all(np.allclose(getattr(again, k), getattr(calib, k)) for k in ("P2", "R0_rect", "Tr_velo_to_cam"))
    good = format_kitti_calib(calib)
    cases = {
        "no Tr_velo_to_cam": "\n".join(l for l in good.splitlines() if not l.startswith("Tr_velo")),
        "R0_rect has 8 numbers": good.replace("R0_rect: ", "R0_rect: ").replace(
            good.splitlines()[4], good.splitlines()[4].rsplit(" ", 1)[0]),
        "not a number": good.replace("P2: ", "P2: x"),
        "singular": good.replace(good.splitlines()[4], "R0_rect: " + " ".join(["0"] * 9)),
        "is not `NAME: numbers`": "P2 1 2 3\n",
    }
    for why, text in cases.items():
        with pytest.raises(CalibrationError, match=why):
            parse_kitti_calib(text)
