"""3D boxes and the frames they live in (numpy only: data, training targets, evaluation and `trainforge predict` use
the same arithmetic).

A box is seven numbers in the LiDAR frame, OpenPCDet's convention: x, y, z (its centre; x forward, y left, z up),
l, w, h (its size along its heading, across it, and up), yaw (the heading about z, from x towards y), in metres and
radians. KITTI's labels give boxes in the rectified camera frame instead (x right, y down, z forward; the location is
the bottom centre; rotation_y about the camera's y): `camera_to_lidar` turns them into the LiDAR frame, once, with the
drive's calibration.

    calib = parse_kitti_calib(Path("calib/000001.txt").read_text())     # P2, R0_rect, Tr_velo_to_cam
    boxes = camera_to_lidar(label_rows, calib)                           # (N, 7): x y z l w h yaw
    bev_iou(boxes, other)                                                # (N, M) rotated IoU seen from above
    iou_3d(boxes, other)                                                 # (N, M) rotated BEV overlap x height overlap
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BOX_FIELDS = ("x", "y", "z", "l", "w", "h", "yaw")
# KITTI's difficulty levels (its devkit's readme): the smallest 2D box height in pixels, the largest occlusion level
# and the largest truncation a ground-truth box may have to count at that level. Easy, moderate, hard.
KITTI_DIFFICULTY = ((40.0, 0, 0.15), (25.0, 1, 0.30), (25.0, 2, 0.50))
DIFFICULTY_NAMES = ("easy", "moderate", "hard")


class CalibrationError(ValueError):
    """A calibration file that does not parse, or whose matrices cannot be inverted."""


@dataclass(frozen=True)
class Calibration:
    """One KITTI frame's calibration: P2 (3x4, rectified camera -> left colour image pixels), R0_rect (3x3) and
    Tr_velo_to_cam (3x4, LiDAR -> reference camera)."""

    P2: np.ndarray
    R0_rect: np.ndarray
    Tr_velo_to_cam: np.ndarray

    @property
    def lidar_to_rect_matrix(self) -> np.ndarray:
        """4x4: a LiDAR point (homogeneous) -> the rectified camera frame."""
        velo = np.eye(4)
        velo[:3, :4] = self.Tr_velo_to_cam
        rect = np.eye(4)
        rect[:3, :3] = self.R0_rect
        return rect @ velo

    def lidar_to_rect(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        return points @ self.lidar_to_rect_matrix[:3, :3].T + self.lidar_to_rect_matrix[:3, 3]

    def rect_to_lidar(self, points: np.ndarray) -> np.ndarray:
        points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        inverse = np.linalg.inv(self.lidar_to_rect_matrix)
        return points @ inverse[:3, :3].T + inverse[:3, 3]

    def rect_to_image(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pixels (N, 2) in the left colour image, and each point's depth (N,) in front of the camera."""
        points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
        projected = np.concatenate([points, np.ones((len(points), 1))], axis=1) @ self.P2.T
        depth = projected[:, 2]
        with np.errstate(divide="ignore", invalid="ignore"):
            return projected[:, :2] / depth[:, None], depth

    def lidar_to_image(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.rect_to_image(self.lidar_to_rect(points))


CALIB_SHAPES = {"P2": (3, 4), "R0_rect": (3, 3), "Tr_velo_to_cam": (3, 4)}


def parse_kitti_calib(text: str) -> Calibration:
    """A KITTI calib/*.txt (`NAME: v1 v2 ...` lines; P0-P3, R0_rect, Tr_velo_to_cam, Tr_imu_to_velo). Raises
    CalibrationError naming what is missing, malformed or singular."""
    found: dict[str, np.ndarray] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, values = line.partition(":")
        if not sep:
            raise CalibrationError(f"line {number} is not `NAME: numbers`")
        name = name.strip()
        if name not in CALIB_SHAPES:
            continue
        try:
            numbers = np.array([float(v) for v in values.split()], dtype=np.float64)
        except ValueError:
            raise CalibrationError(f"line {number} ({name}) holds something that is not a number") from None
        shape = CALIB_SHAPES[name]
        if numbers.size != shape[0] * shape[1]:
            raise CalibrationError(f"{name} has {numbers.size} numbers, not {shape[0] * shape[1]}")
        found[name] = numbers.reshape(shape)
    missing = [name for name in CALIB_SHAPES if name not in found]
    if missing:
        raise CalibrationError(f"no {', '.join(missing)}")
    if not np.all(np.isfinite(np.concatenate([m.ravel() for m in found.values()]))):
        raise CalibrationError("a matrix holds NaN or infinity")
    calib = Calibration(**found)
    if abs(np.linalg.det(calib.lidar_to_rect_matrix)) < 1e-9:
        raise CalibrationError("R0_rect x Tr_velo_to_cam is singular: the LiDAR frame cannot be recovered")
    if abs(np.linalg.det(calib.P2[:, :3])) < 1e-9:
        raise CalibrationError("P2 is singular: nothing projects into the image")
    return calib


def format_kitti_calib(calib: Calibration) -> str:
    """The text parse_kitti_calib reads (P0-P3 all P2, as a monocular set; R0_rect; Tr_velo_to_cam; Tr_imu_to_velo
    the identity's 3x4)."""
    def row(name: str, m: np.ndarray) -> str:
        return f"{name}: " + " ".join(f"{v:.12e}" for v in np.asarray(m, dtype=np.float64).ravel())

    return "\n".join([*(row(f"P{i}", calib.P2) for i in range(4)), row("R0_rect", calib.R0_rect),
                      row("Tr_velo_to_cam", calib.Tr_velo_to_cam), row("Tr_imu_to_velo", np.eye(4)[:3])]) + "\n"


def limit_period(angle: np.ndarray | float, period: float = 2 * np.pi) -> np.ndarray:
    """An angle wrapped into [-period/2, period/2)."""
    return np.asarray(angle) - np.floor(np.asarray(angle) / period + 0.5) * period


def camera_to_lidar(h_w_l_xyz_ry: np.ndarray, calib: Calibration) -> np.ndarray:
    """KITTI label values (N, 7): h, w, l, x, y, z (bottom centre, rectified camera frame), rotation_y -> boxes (N, 7)
    in the LiDAR frame: x, y, z (the centre), l, w, h, yaw. The bottom centre moves to the LiDAR frame and up by h/2;
    rotation_y turns about the camera's y (down) from its x (right), yaw about z (up) from x (forward): with the
    standard KITTI extrinsics (camera z = LiDAR x, camera x = -LiDAR y), yaw = -rotation_y - pi/2."""
    rows = np.asarray(h_w_l_xyz_ry, dtype=np.float64).reshape(-1, 7)
    h, w, l, ry = rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 6]
    centre = calib.rect_to_lidar(rows[:, 3:6])
    centre[:, 2] += h / 2
    return np.column_stack([centre, l, w, h, limit_period(-ry - np.pi / 2)])


def lidar_to_camera(boxes: np.ndarray, calib: Calibration) -> np.ndarray:
    """The inverse of camera_to_lidar: boxes (N, 7) -> KITTI label values (N, 7) h, w, l, x, y, z, rotation_y."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    bottom = boxes[:, :3].copy()
    bottom[:, 2] -= boxes[:, 5] / 2
    location = calib.lidar_to_rect(bottom)
    return np.column_stack([boxes[:, 5], boxes[:, 4], boxes[:, 3], location,
                            limit_period(-boxes[:, 6] - np.pi / 2)])


def corners_bev(boxes: np.ndarray) -> np.ndarray:
    """(N, 4, 2): each box's corners seen from above, counter-clockwise, the front-right one first."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    half = np.array([[0.5, -0.5], [0.5, 0.5], [-0.5, 0.5], [-0.5, -0.5]])  # (l, w) signs, counter-clockwise
    local = half[None] * boxes[:, None, 3:5]
    c, s = np.cos(boxes[:, 6])[:, None], np.sin(boxes[:, 6])[:, None]
    x = local[..., 0] * c - local[..., 1] * s + boxes[:, None, 0]
    y = local[..., 0] * s + local[..., 1] * c + boxes[:, None, 1]
    return np.stack([x, y], axis=-1)


def corners_3d(boxes: np.ndarray) -> np.ndarray:
    """(N, 8, 3): the four bottom corners (as corners_bev), then the four top ones."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    bev = corners_bev(boxes)
    bottom = (boxes[:, 2] - boxes[:, 5] / 2)[:, None, None].repeat(4, axis=1)
    top = (boxes[:, 2] + boxes[:, 5] / 2)[:, None, None].repeat(4, axis=1)
    return np.concatenate([np.concatenate([bev, bottom], axis=-1), np.concatenate([bev, top], axis=-1)], axis=1)


def _cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - (a[..., 1] - o[..., 1]) * (b[..., 0] - o[..., 0])


def _inside(points: np.ndarray, polygon: np.ndarray, eps: float) -> np.ndarray:
    """points (..., P, 2) inside (or on) the counter-clockwise convex quadrilateral polygon (..., 4, 2): (..., P)."""
    edge_start = polygon[..., None, :, :]                       # (..., 1, 4, 2)
    edge_end = np.roll(polygon, -1, axis=-2)[..., None, :, :]
    return np.all(_cross(edge_start, edge_end, points[..., :, None, :]) >= -eps, axis=-1)


def _intersection_area(a: np.ndarray, b: np.ndarray, eps: float = 1e-9) -> np.ndarray:
    """Areas of the intersections of convex counter-clockwise quadrilaterals a[i] and b[i] (K, 4, 2) -> (K,). The
    intersection's vertices are the corners of each inside the other and the points where their edges cross; sorted
    by angle about their mean, the shoelace formula gives its area (exact: the intersection is convex)."""
    k = len(a)
    if k == 0:
        return np.zeros(0)
    p, r = a[:, :, None, :], (np.roll(a, -1, axis=1) - a)[:, :, None, :]        # a's edges p + t r
    q, s = b[:, None, :, :], (np.roll(b, -1, axis=1) - b)[:, None, :, :]        # b's edges q + u s
    denom = r[..., 0] * s[..., 1] - r[..., 1] * s[..., 0]                       # (K, 4, 4)
    parallel = np.abs(denom) < eps
    safe = np.where(parallel, 1.0, denom)
    qp = q - p
    t = (qp[..., 0] * s[..., 1] - qp[..., 1] * s[..., 0]) / safe
    u = (qp[..., 0] * r[..., 1] - qp[..., 1] * r[..., 0]) / safe
    crossing = ~parallel & (t >= -eps) & (t <= 1 + eps) & (u >= -eps) & (u <= 1 + eps)
    crossings = (p + t[..., None] * r).reshape(k, 16, 2)
    points = np.concatenate([a, b, crossings], axis=1)                          # (K, 24, 2)
    valid = np.concatenate([_inside(a, b, eps), _inside(b, a, eps), crossing.reshape(k, 16)], axis=1)
    count = valid.sum(axis=1)
    centre = (points * valid[..., None]).sum(axis=1) / np.maximum(count, 1)[:, None]
    # an unused point takes the place of the pair's first valid one: a duplicate adds a zero-length edge, no area
    first = points[np.arange(k), np.argmax(valid, axis=1)]
    points = np.where(valid[..., None], points, first[:, None, :])
    angle = np.arctan2(points[..., 1] - centre[:, None, 1], points[..., 0] - centre[:, None, 0])
    ordered = np.take_along_axis(points, np.argsort(angle, axis=1, kind="stable")[..., None], axis=1)
    nxt = np.roll(ordered, -1, axis=1)
    area = 0.5 * np.abs(np.sum(ordered[..., 0] * nxt[..., 1] - ordered[..., 1] * nxt[..., 0], axis=1))
    return np.where(count >= 3, area, 0.0)


def bev_overlap(a: np.ndarray, b: np.ndarray, chunk_pairs: int = 200_000) -> np.ndarray:
    """(N, M) areas, in square metres, where box a[i] and box b[j] overlap seen from above (rotated)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 7)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 7)
    out = np.zeros((len(a), len(b)))
    if not len(a) or not len(b):
        return out
    ca, cb = corners_bev(a), corners_bev(b)
    # pairs whose circumscribed circles are apart cannot overlap: only the others are clipped
    radius_a, radius_b = np.hypot(a[:, 3], a[:, 4]) / 2, np.hypot(b[:, 3], b[:, 4]) / 2
    near = (np.hypot(a[:, None, 0] - b[None, :, 0], a[:, None, 1] - b[None, :, 1])
            <= radius_a[:, None] + radius_b[None, :])
    i, j = np.nonzero(near)
    for start in range(0, len(i), chunk_pairs):
        ii, jj = i[start:start + chunk_pairs], j[start:start + chunk_pairs]
        out[ii, jj] = _intersection_area(ca[ii], cb[jj])
    return out


def bev_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, M) rotated IoU of the boxes seen from above."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 7)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 7)
    inter = bev_overlap(a, b)
    union = (a[:, 3] * a[:, 4])[:, None] + (b[:, 3] * b[:, 4])[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def iou_3d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N, M) 3D IoU: the rotated overlap seen from above times the overlap in height, over the union of volumes."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 7)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 7)
    bottom = np.maximum((a[:, 2] - a[:, 5] / 2)[:, None], (b[:, 2] - b[:, 5] / 2)[None, :])
    top = np.minimum((a[:, 2] + a[:, 5] / 2)[:, None], (b[:, 2] + b[:, 5] / 2)[None, :])
    inter = bev_overlap(a, b) * np.clip(top - bottom, 0, None)
    union = np.prod(a[:, 3:6], axis=1)[:, None] + np.prod(b[:, 3:6], axis=1)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def points_in_boxes(points: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """(P, N) whether point p (x, y, z, ...) lies inside box n (its faces included)."""
    points = np.asarray(points, dtype=np.float64)[:, :3]
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    d = points[:, None, :] - boxes[None, :, :3]
    c, s = np.cos(boxes[:, 6])[None], np.sin(boxes[:, 6])[None]
    along = d[..., 0] * c + d[..., 1] * s
    across = -d[..., 0] * s + d[..., 1] * c
    return ((np.abs(along) <= boxes[None, :, 3] / 2) & (np.abs(across) <= boxes[None, :, 4] / 2)
            & (np.abs(d[..., 2]) <= boxes[None, :, 5] / 2))


def kitti_difficulty(height_px: np.ndarray, occlusion: np.ndarray, truncation: np.ndarray) -> np.ndarray:
    """KITTI's difficulty of each ground-truth box: 0 easy, 1 moderate, 2 hard, -1 none of them (too small, too
    occluded or too truncated to count; evaluation ignores it). The easiest level whose limits the box meets."""
    height_px, occlusion, truncation = (np.asarray(v, dtype=np.float64) for v in (height_px, occlusion, truncation))
    level = np.full(height_px.shape, -1, dtype=np.int64)
    for i, (min_height, max_occlusion, max_truncation) in reversed(list(enumerate(KITTI_DIFFICULTY))):
        meets = (height_px >= min_height) & (occlusion <= max_occlusion) & (truncation <= max_truncation)
        level = np.where(meets, i, level)
    return level
