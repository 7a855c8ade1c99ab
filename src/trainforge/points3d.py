"""Point clouds as a model reads them (numpy only: the training collate and `trainforge predict` run the same code, so
the same points give the same pillars in both): voxelization into pillars, and the global augmentations that move
points and their boxes together, each recorded so a point can be taken back to where the sensor saw it.

    points = model_points(read_points("000001.bin"), point_cloud_range, ["x", "y", "z", "intensity"])
    pillars = voxelize(points, point_cloud_range, voxel_size, max_points_per_voxel=32, max_voxels=16000)
    pillars.voxels (V, P, F), pillars.coords (V, 2) as (row y, column x) of the BEV grid, pillars.counts (V,)

    points, boxes, record = global_transform(points, boxes, rotation=0.3, scale=1.02, flip_y=True)
    original = undo_points(points, record)

    database = build_object_database(frames, min_points=5)    # frames: (points, boxes, labels) of the train split
    points, boxes, labels, taken = paste_objects(points, boxes, labels, database, {0: 15}, draw)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

POINT_SUFFIXES = (".bin", ".npy", ".pcd")  # the points files read (read_points)
FEATURES = ("x", "y", "z", "intensity")  # what a point may hold, in the order a KITTI .bin stores it


def read_points(path: str | Path, bin_features: int = 4) -> np.ndarray:
    """A points file as float32 (N, F): .bin (float32 records of `bin_features` values), .npy (a 2D float array of
    3 or more columns) or .pcd (x, y, z and intensity where it has one, through pypcd4). Raises ValueError saying why
    the file is not one."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".bin":
        size = path.stat().st_size
        if size % (4 * bin_features):
            raise ValueError(f"{size} bytes are not whole records of {bin_features} float32 values")
        return np.fromfile(path, dtype=np.float32).reshape(-1, bin_features)
    if suffix == ".npy":
        array = np.load(path, allow_pickle=False, mmap_mode="r")
        if array.ndim != 2 or array.shape[1] < 3 or array.dtype.kind != "f":
            raise ValueError(f"a {array.dtype} array of shape {array.shape}, not (N, 3 or more) floats")
        return np.ascontiguousarray(array, dtype=np.float32)
    if suffix == ".pcd":
        from pypcd4 import PointCloud

        cloud = PointCloud.from_path(path)
        fields = [f for f in ("x", "y", "z", "intensity") if f in cloud.fields]
        if fields[:3] != ["x", "y", "z"]:
            raise ValueError(f"fields {', '.join(cloud.fields)}: no x, y, z")
        return np.asarray(cloud.numpy(tuple(fields)), dtype=np.float32).reshape(-1, len(fields))
    raise ValueError(f"not one of {', '.join(POINT_SUFFIXES)}")


def in_range(points: np.ndarray, point_cloud_range: list[float]) -> np.ndarray:
    """Which finite points lie inside the range (min inclusive, max exclusive, as a voxel grid's cells are)."""
    r = point_cloud_range
    xyz = points[:, :3]
    return (np.isfinite(points).all(1) & (xyz[:, 0] >= r[0]) & (xyz[:, 0] < r[3]) & (xyz[:, 1] >= r[1])
            & (xyz[:, 1] < r[4]) & (xyz[:, 2] >= r[2]) & (xyz[:, 2] < r[5]))


def model_points(points: np.ndarray, point_cloud_range: Sequence[float], features: Sequence[str]) -> np.ndarray:
    """A frame's points as the model reads them: the finite points inside the range, in cloud order, cut to the
    named features (data.args.point_features, x y z first). Training's samples and `trainforge predict` both."""
    columns = [FEATURES.index(f) for f in features]
    points = points[in_range(points, list(point_cloud_range))]
    if max(columns) >= points.shape[1]:
        raise ValueError(f"{points.shape[1]} values a point; the model reads {', '.join(features)}")
    return np.ascontiguousarray(points[:, columns])


@dataclass(frozen=True)
class Pillars:
    """The non-empty pillars of one frame, in the order their first point comes in the cloud."""

    voxels: np.ndarray   # float32 (V, P, F): each pillar's first P points, zero-padded
    coords: np.ndarray   # int64 (V, 2): (row, column) = (y cell, x cell) in the BEV grid
    counts: np.ndarray   # int64 (V,): points in each pillar (at most P)
    dropped_points: int  # points beyond P in their pillar, or in pillars beyond max_voxels


def grid_size(point_cloud_range, voxel_size) -> tuple[int, int]:
    """(columns along x, rows along y) of the BEV grid."""
    r, v = point_cloud_range, voxel_size
    return int(round((r[3] - r[0]) / v[0])), int(round((r[4] - r[1]) / v[1]))


def voxelize(points: np.ndarray, point_cloud_range, voxel_size, max_points_per_voxel: int,
             max_voxels: int) -> Pillars:
    """Pillars of the points inside the range (a point on a cell's lower edge belongs to it; the range's upper edge
    is outside): a pillar per occupied (x, y) cell, keeping its first `max_points_per_voxel` points in cloud order;
    the first `max_voxels` pillars by their first point. Deterministic: it depends on the points and their order
    only."""
    points = np.asarray(points, dtype=np.float32)
    r = np.asarray(point_cloud_range, dtype=np.float64)
    v = np.asarray(voxel_size, dtype=np.float64)
    columns, rows = grid_size(r, v)
    xyz = points[:, :3].astype(np.float64)
    cell = np.floor((xyz - r[:3]) / v).astype(np.int64)
    inside = (np.isfinite(points).all(1) & (cell[:, 0] >= 0) & (cell[:, 0] < columns) & (cell[:, 1] >= 0)
              & (cell[:, 1] < rows) & (xyz[:, 2] >= r[2]) & (xyz[:, 2] < r[5]))
    points, cell = points[inside], cell[inside]
    key = cell[:, 1] * columns + cell[:, 0]
    unique, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # pillars in the order their first point comes
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    pillar = rank[inverse]                     # each point's pillar, numbered by first appearance
    # each point's place within its pillar: how many points of the same pillar came before it
    by_pillar = np.argsort(pillar, kind="stable")
    starts = np.searchsorted(pillar[by_pillar], np.arange(len(unique)))
    slot = np.empty(len(points), dtype=np.int64)
    slot[by_pillar] = np.arange(len(points)) - starts[pillar[by_pillar]]
    keep = (pillar < max_voxels) & (slot < max_points_per_voxel)
    kept = min(len(unique), max_voxels)
    voxels = np.zeros((kept, max_points_per_voxel, points.shape[1]), dtype=np.float32)
    voxels[pillar[keep], slot[keep]] = points[keep]
    counts = np.bincount(pillar[keep], minlength=kept)[:kept].astype(np.int64)
    chosen = unique[order[:kept]]
    coords = np.stack([chosen // columns, chosen % columns], axis=1).astype(np.int64)
    return Pillars(voxels, coords, counts, int(len(points) - keep.sum()))


@dataclass(frozen=True)
class Transform:
    """What global_transform did, in order: flip (y -> -y) first, then the turn about z, then the scaling."""

    flip_y: bool = False
    rotation: float = 0.0
    scale: float = 1.0

    def as_dict(self) -> dict:
        return {"flip_y": self.flip_y, "rotation": self.rotation, "scale": self.scale}


def _turn(xy: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.stack([xy[:, 0] * c - xy[:, 1] * s, xy[:, 0] * s + xy[:, 1] * c], axis=1)


def global_transform(points: np.ndarray, boxes: np.ndarray, *, rotation: float = 0.0, scale: float = 1.0,
                     flip_y: bool = False) -> tuple[np.ndarray, np.ndarray, Transform]:
    """The frame mirrored across the x axis (flip_y: y -> -y, a heading -> its negative), turned about z by
    `rotation` radians, and scaled by `scale` about the sensor: points (N, F) and boxes (n, 7) alike."""
    points = np.array(points, dtype=np.float32, copy=True)
    boxes = np.array(boxes, dtype=np.float64, copy=True).reshape(-1, 7)
    xyz = points[:, :3].astype(np.float64)
    if flip_y:
        xyz[:, 1] = -xyz[:, 1]
        boxes[:, 1] = -boxes[:, 1]
        boxes[:, 6] = -boxes[:, 6]
    if rotation:
        xyz[:, :2] = _turn(xyz[:, :2], rotation)
        boxes[:, :2] = _turn(boxes[:, :2], rotation)
        boxes[:, 6] += rotation
    xyz *= scale
    boxes[:, :6] *= scale
    boxes[:, 6] = np.arctan2(np.sin(boxes[:, 6]), np.cos(boxes[:, 6]))
    points[:, :3] = xyz
    return points, boxes, Transform(flip_y, float(rotation), float(scale))


def undo_points(points: np.ndarray, record: Transform) -> np.ndarray:
    """Points moved by global_transform, back where the sensor saw them (for projecting into the camera)."""
    xyz = np.asarray(points, dtype=np.float64)[:, :3] / record.scale
    if record.rotation:
        xyz[:, :2] = _turn(xyz[:, :2], -record.rotation)
    if record.flip_y:
        xyz[:, 1] = -xyz[:, 1]
    return xyz


# ---- ground-truth sampling (SECOND's, as OpenPCDet's gt_sampling): objects of other frames pasted into this one


@dataclass(frozen=True)
class ObjectDatabase:
    """The labelled objects of a set of frames (the train split's), each with the points inside its box, in the
    LiDAR frame it was seen in (a pasted object lands where it was, at the range and angle its points were seen)."""

    boxes: np.ndarray          # float64 (M, 7)
    labels: np.ndarray         # int64 (M,)
    points: tuple[np.ndarray, ...]  # M float32 arrays (k, F): each object's points
    difficulty: np.ndarray     # int64 (M,): its KITTI difficulty, -1 where the labels carry none

    def counts(self, num_classes: int) -> list[int]:
        return np.bincount(self.labels, minlength=num_classes)[:num_classes].tolist()


def build_object_database(frames, min_points: int) -> ObjectDatabase:
    """The objects of `frames` (each (points (N, F), boxes (n, 7), labels (n,)[, difficulty (n,)])) holding at least
    `min_points` points (OpenPCDet's filter_by_min_points: an object seen by a few points teaches nothing)."""
    from trainforge.boxes3d import points_in_boxes

    boxes, labels, points, difficulty = [], [], [], []
    for frame in frames:
        cloud, frame_boxes, frame_labels = frame[0], np.asarray(frame[1]).reshape(-1, 7), np.asarray(frame[2])
        frame_difficulty = np.asarray(frame[3]) if len(frame) > 3 and frame[3] is not None else None
        if not len(frame_boxes):
            continue
        inside = points_in_boxes(cloud, frame_boxes)
        for j in range(len(frame_boxes)):
            mine = cloud[inside[:, j]]
            if len(mine) >= min_points:
                boxes.append(frame_boxes[j])
                labels.append(int(frame_labels[j]))
                points.append(np.ascontiguousarray(mine, dtype=np.float32))
                difficulty.append(-1 if frame_difficulty is None else int(frame_difficulty[j]))
    return ObjectDatabase(np.asarray(boxes, dtype=np.float64).reshape(-1, 7), np.asarray(labels, dtype=np.int64),
                          tuple(points), np.asarray(difficulty, dtype=np.int64))


def paste_objects(points: np.ndarray, boxes: np.ndarray, labels: np.ndarray, database: ObjectDatabase,
                  wanted: dict[int, int], draw) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The frame with objects of `database` pasted in until it holds `wanted[c]` objects of class c, where they fit:
    for each class in turn, `draw(n, k)` picks k of its n database objects (a permutation's first k: the sample's
    seeded generator, so a resumed run pastes the same); a candidate whose box overlaps a box of the frame, or one
    pasted before it, seen from above, is left out (SECOND's collision check). The frame's points inside a pasted box
    are removed and the object's points appended after the frame's own (the first len(points) - pasted points are the
    sensor's). Returns points, boxes, labels and the database indices pasted (their boxes are the last ones)."""
    from trainforge.boxes3d import bev_overlap, points_in_boxes

    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 7)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    taken: list[int] = []
    placed = boxes
    for label, count in sorted(wanted.items()):
        need = int(count) - int((labels == label).sum())
        pool = np.flatnonzero(database.labels == label)
        if need <= 0 or not len(pool):
            continue
        for i in pool[np.asarray(draw(len(pool), min(need, len(pool))), dtype=np.int64)]:
            candidate = database.boxes[i][None]
            if len(placed) and bev_overlap(candidate, placed).max() > 0:
                continue
            placed = np.concatenate([placed, candidate])
            taken.append(int(i))
    if not taken:
        return points, boxes, labels, np.zeros(0, dtype=np.int64)
    chosen = np.asarray(taken, dtype=np.int64)
    pasted = database.boxes[chosen]
    keep = ~points_in_boxes(points, pasted).any(axis=1)
    cloud = np.concatenate([np.asarray(points, dtype=np.float32)[keep], *(database.points[i] for i in chosen)])
    return (cloud, np.concatenate([boxes, pasted]), np.concatenate([labels, database.labels[chosen]]), chosen)
