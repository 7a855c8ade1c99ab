"""LiDAR point clouds with 3D boxes (issue 52): `kitti` (KITTI's 3D object layout) and `pointclouds` (OpenPCDet's
custom layout). Both give the same samples from the same scenes.

    kitti:        data.path/velodyne/*.bin (float32 x, y, z, intensity), label_2/*.txt (type, truncated, occluded,
                  alpha, 2D box, h w l, x y z of the bottom centre in the rectified camera frame, rotation_y),
                  calib/*.txt (P2, R0_rect, Tr_velo_to_cam), image_2/*.png (kept for fusion and pictures),
                  ImageSets/{train,val,test}.txt where present
    pointclouds:  data.path/points/*.npy, *.bin or *.pcd (pypcd4), labels/*.txt (`x y z dx dy dz heading class`, the
                  LiDAR frame), ImageSets/ where present

Boxes come out in the LiDAR frame (boxes3d: x y z l w h yaw; a KITTI label turned by its frame's calibration, once,
in boxes3d.camera_to_lidar). KITTI's `DontCare` rows are regions, not objects: skipped (counted in the report). Where
the labels carry them (KITTI), each box's difficulty level comes from its 2D height, occlusion and truncation.

A sample is (points float32 (N, F): the finite points inside data.args.point_cloud_range, F the features named by
data.args.point_features; {"boxes": float32 (n, 7), "labels": int64 (n,) indices into data.args.classes,
"difficulty": int64 (n,), KITTI only: 0 easy, 1 moderate, 2 hard, -1 none}).

Cleaning, each reason counted in data_report.json's `dropped` and said on the console:
  frames: missing_points (a frame the labels or ImageSets name without its points file), unreadable_points (not whole
          records, or not readable), missing_labels, missing_calib (KITTI), singular_calib, empty_frame (no finite
          point in range);
  boxes:  bad_label_line (a line that does not parse), unknown_class (a class not in data.args.classes),
          bad_size (a size of zero or less), out_of_range (a centre outside point_cloud_range);
  points: nonfinite_points (NaN or infinite: dropped from their frame, which stays).
A label or calibration file whose format is wrong as a whole (not text; no line of it parses; a calibration that
does not parse) is one line naming the file, exit 2: nothing is trained on a misread folder.

"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from trainforge.boxes3d import (CalibrationError, camera_to_lidar, kitti_difficulty, parse_kitti_calib)
from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import DropLog, Pool, Samples, SampleUnreadable
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args, require_path
from trainforge.errors import UserError
from trainforge.hardware.cpus import available_cpus
from trainforge.points3d import FEATURES, POINT_SUFFIXES, in_range, model_points, read_points  # noqa: F401

FRAME_REASONS = ("missing_points", "unreadable_points", "missing_labels", "missing_calib", "singular_calib",
                 "empty_frame")
BOX_REASONS = ("bad_label_line", "unknown_class", "bad_size", "out_of_range")
POINT_REASONS = ("nonfinite_points",)
MAX_LABEL_BYTES = 16 << 20  # a label file is a few KB; a larger one is not a label file


class PointArgs(SourceArgs):
    """data.args of `kitti` and `pointclouds` (OpenPCDet's names and KITTI defaults)."""

    classes: list[str] = Field(default_factory=lambda: ["Car", "Pedestrian", "Cyclist"], min_length=1)
    # x_min, y_min, z_min, x_max, y_max, z_max in metres, the LiDAR frame: points outside are not read
    point_cloud_range: list[float] = Field(default_factory=lambda: [0.0, -39.68, -3.0, 69.12, 39.68, 1.0])
    voxel_size: list[float] = Field(default_factory=lambda: [0.16, 0.16, 4.0])  # a pillar's x, y, z extent, metres
    max_points_per_voxel: int = Field(32, gt=0, le=1024)
    max_voxels: list[int] = Field(default_factory=lambda: [16000, 40000])  # pillars kept, train and eval
    point_features: list[str] = Field(default_factory=lambda: list(FEATURES))
    bin_features: int = Field(4, ge=3, le=64)  # float32 values per point in a .bin file (KITTI 4, nuScenes 5)

    @field_validator("point_cloud_range")
    @classmethod
    def _range(cls, v: list[float]) -> list[float]:
        if len(v) != 6 or not all(math.isfinite(x) for x in v) or not all(v[i] < v[i + 3] for i in range(3)):
            raise ValueError("give x_min, y_min, z_min, x_max, y_max, z_max with each min below its max")
        return v

    @field_validator("voxel_size")
    @classmethod
    def _voxel(cls, v: list[float]) -> list[float]:
        if len(v) != 3 or not all(math.isfinite(x) and x > 0 for x in v):
            raise ValueError("give a pillar's x, y, z size in metres, each above 0")
        return v

    @field_validator("max_voxels")
    @classmethod
    def _max_voxels(cls, v: list[int]) -> list[int]:
        if len(v) != 2 or not all(0 < x <= 1_000_000 for x in v):
            raise ValueError("give [train, eval] pillar counts, each from 1 to 1,000,000")
        return v

    @field_validator("point_features")
    @classmethod
    def _features(cls, v: list[str]) -> list[str]:
        if v[:3] != ["x", "y", "z"] or any(f not in FEATURES for f in v) or len(set(v)) != len(v):
            raise ValueError(f"x, y, z first, then any of {', '.join(FEATURES[3:])}")
        return v

    @model_validator(mode="after")
    def _grid(self) -> "PointArgs":
        r, v = self.point_cloud_range, self.voxel_size
        for axis, name in enumerate("xyz"):
            cells = (r[axis + 3] - r[axis]) / v[axis]
            if abs(cells - round(cells)) > 1e-4:
                raise ValueError(f"point_cloud_range's {name} extent ({r[axis + 3] - r[axis]:g} m) is not a whole "
                                 f"number of voxel_size {v[axis]:g} m")
        return self

    @property
    def grid_size(self) -> tuple[int, int, int]:
        r, v = self.point_cloud_range, self.voxel_size
        return tuple(int(round((r[i + 3] - r[i]) / v[i])) for i in range(3))  # type: ignore[return-value]


@dataclass
class Frame:
    """One frame as its files name it, before cleaning."""

    stem: str
    points: Optional[Path]
    boxes: np.ndarray  # (n, 7) LiDAR frame
    names: list[str]
    difficulty: Optional[np.ndarray] = None


class PointSamples(Samples):
    """The kept frames; frame i's points are read, kept in range and cut to the features when asked for."""

    def __init__(self, files: list[str], boxes: list[np.ndarray], labels: list[np.ndarray],
                 difficulty: Optional[list[np.ndarray]], args: PointArgs) -> None:
        self.files, self.boxes, self.labels, self.difficulty, self.args = files, boxes, labels, difficulty, args
        self.train_indices: Optional[np.ndarray] = None  # the train split's frames, once split (after_split)

    def __len__(self) -> int:
        return len(self.files)

    def points(self, index: int) -> np.ndarray:
        try:
            points = read_points(self.files[index], self.args.bin_features)
        except Exception as e:  # a file changed since it was read
            raise SampleUnreadable(self.files[index]) from e
        try:
            return model_points(points, self.args.point_cloud_range, self.args.point_features)
        except ValueError as e:  # fewer values a point than the features named
            raise SampleUnreadable(self.files[index]) from e

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        target = {"boxes": torch.from_numpy(self.boxes[index].astype(np.float32)).reshape(-1, 7),
                  "labels": torch.from_numpy(self.labels[index]).reshape(-1)}
        if self.difficulty is not None:
            target["difficulty"] = torch.from_numpy(self.difficulty[index]).reshape(-1)
        return torch.from_numpy(self.points(index)), target

    def subset(self, keep: np.ndarray) -> "PointSamples":
        return PointSamples([self.files[i] for i in keep], [self.boxes[i] for i in keep],
                            [self.labels[i] for i in keep],
                            None if self.difficulty is None else [self.difficulty[i] for i in keep], self.args)

    def after_split(self, pool: Pool, splits: dict[str, np.ndarray], cfg: DataConfig,
                    stored: Optional[dict[str, Any]]) -> tuple[Pool, dict[str, np.ndarray]]:
        """Ground-truth sampling pastes objects of the train split only: its frames are noted here."""
        self.train_indices = np.asarray(splits["train"], dtype=np.int64)
        return pool, splits

    def target_augment(self, augment: Any) -> Any:
        """A point augmenter that pastes objects gets the train split's objects to paste (built on first use)."""
        import dataclasses

        if not getattr(augment, "gt_sampling", None):
            return augment
        classes = list(self.args.classes)
        unknown = [name for name, _ in augment.gt_sampling if name not in classes]
        if unknown:
            raise UserError(f"data.augment.gt_sampling: {', '.join(map(str, unknown))} not among data.args.classes "
                            f"({', '.join(classes)}); name classes of the data")
        wanted = {classes.index(name): count for name, count in augment.gt_sampling}
        if self.train_indices is None:  # never all frames: the test split's objects would leak into training
            raise RuntimeError("ground-truth sampling needs the train split: after_split comes before target_augment")
        objects = TrainObjects(self, self.train_indices, augment.gt_min_points, wanted)
        return dataclasses.replace(augment, objects=objects)


class TrainObjects:
    """The train split's objects for ground-truth sampling (`trainforge.points3d.build_object_database`), built the
    first time a training sample asks for them, in each process that reads samples (a DataLoader worker builds its
    own, the same): evaluation and compress, which never paste, never read them."""

    def __init__(self, samples: PointSamples, indices: np.ndarray, min_points: int, wanted: dict[int, int]) -> None:
        self.samples, self.indices, self.min_points, self.wanted = samples, indices, min_points, wanted
        self._database: Any = None

    def get(self) -> Any:
        if self._database is None:
            from trainforge.points3d import build_object_database

            s = self.samples
            frames = ((s.points(int(i)), s.boxes[int(i)], s.labels[int(i)],
                       None if s.difficulty is None else s.difficulty[int(i)]) for i in self.indices)
            self._database = build_object_database(frames, self.min_points)
        return self._database

    def __getstate__(self) -> dict[str, Any]:  # a worker builds its own rather than receive a pickled copy
        return {**self.__dict__, "_database": None}


def read_label_text(path: Path) -> list[str]:
    """The lines of a label file; a file that is not one (binary, not UTF-8, absurdly large) is one line, exit 2."""
    text = _small_text(path, "a label file", "write one box a line")
    return [line for line in text.splitlines() if line.strip()]


def _small_text(path: Path, what: str, fix: str) -> str:
    """A label or calibration file's text; one that is not one (over MAX_LABEL_BYTES, not UTF-8, NUL bytes) is one
    line naming it, exit 2."""
    size = path.stat().st_size
    if size > MAX_LABEL_BYTES:
        raise UserError(f"{path}: {size:,} bytes is not {what} (a few KB); {fix}", public=True)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text, so not {what}; {fix}", public=True) from None
    if "\x00" in text:
        raise UserError(f"{path}: holds NUL bytes, so not {what}; {fix}", public=True)
    return text


def _numbers(values: list[str]) -> Optional[list[float]]:
    try:
        out = [float(v) for v in values]
    except ValueError:
        return None
    return out if all(math.isfinite(v) for v in out) else None


def parse_kitti_labels(path: Path, calib, drops: DropLog, notes: dict[str, int]) -> Frame:
    """label_2 rows -> boxes in the LiDAR frame (names as written; DontCare skipped) with their difficulty."""
    boxes, names, difficulty = [], [], []
    lines = read_label_text(path)
    parsed = 0
    for number, line in enumerate(lines, 1):
        parts = line.split()
        values = _numbers(parts[1:15]) if len(parts) in (15, 16) else None  # 16: a score column (results files)
        if values is None:
            drops.drop("bad_label_line", f"{path.name} line {number}")
            continue
        parsed += 1
        if parts[0] == "DontCare":
            notes["dont_care"] = notes.get("dont_care", 0) + 1
            continue
        truncated, occluded, _alpha, _x1, y1, _x2, y2, h, w, l, x, y, z, ry = values
        boxes.append(camera_to_lidar(np.array([[h, w, l, x, y, z, ry]]), calib)[0])
        names.append(parts[0])
        difficulty.append(kitti_difficulty(np.array([y2 - y1]), np.array([occluded]), np.array([truncated]))[0])
    if lines and not parsed:
        raise UserError(f"{path}: no line is a KITTI label (type truncated occluded alpha x1 y1 x2 y2 h w l x y z "
                        "rotation_y: 15 values); fix the file or point data.path at a KITTI folder", public=True)
    return Frame(path.stem, None, np.asarray(boxes, dtype=np.float64).reshape(-1, 7), names,
                 np.asarray(difficulty, dtype=np.int64))


def parse_openpcdet_labels(path: Path, drops: DropLog) -> Frame:
    """labels/*.txt rows `x y z dx dy dz heading class` (the LiDAR frame)."""
    boxes, names = [], []
    lines = read_label_text(path)
    parsed = 0
    for number, line in enumerate(lines, 1):
        parts = line.split()
        values = _numbers(parts[:7]) if len(parts) == 8 else None
        if values is None:
            drops.drop("bad_label_line", f"{path.name} line {number}")
            continue
        parsed += 1
        boxes.append(values)
        names.append(parts[7])
    if lines and not parsed:
        raise UserError(f"{path}: no line is an OpenPCDet label (x y z dx dy dz heading class); fix the file or "
                        "point data.path at a folder of that layout", public=True)
    return Frame(path.stem, None, np.asarray(boxes, dtype=np.float64).reshape(-1, 7), names)


def image_sets(root: Path) -> Optional[dict[str, list[str]]]:
    """ImageSets/{train,val,test}.txt where present: each split's frame names, in the file's order."""
    folder = root / "ImageSets"
    if not folder.is_dir():
        return None
    splits = {}
    for split in ("train", "val", "test"):
        file = folder / f"{split}.txt"
        if file.is_file():
            names = [line.strip() for line in read_label_text(file)]
            bad = next((n for n in names if Path(n).name != n or n in ("", ".", "..")), None)
            if bad is not None:
                raise UserError(f"{file}: {bad!r} is not a frame name; list frame names (000123), one a line",
                                public=True)
            splits[split] = names
    if "train" not in splits:
        return None
    overlap = set(splits["train"]) & set(splits.get("val", [])) | set(splits["train"]) & set(splits.get("test", []))
    if overlap:
        raise UserError(f"{folder}: frame {sorted(overlap)[0]} is in train and in another split; list each frame "
                        "in one split", public=True)
    return splits


def _points_file(folder: Path, stem: str) -> Optional[Path]:
    for suffix in POINT_SUFFIXES:
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    return None


def _scan(path: Path, args: PointArgs) -> tuple[str, int, int]:
    """(verdict, points in range, non-finite points) of one points file: ok, unreadable."""
    try:
        points = read_points(path, args.bin_features)
    except Exception:  # noqa: BLE001 - whatever a broken file raises, it is one unreadable frame
        return "unreadable", 0, 0
    if max(FEATURES.index(f) for f in args.point_features) >= points.shape[1]:  # no intensity column to read
        return "unreadable", 0, 0
    finite = np.isfinite(points).all(1)
    return "ok", int(in_range(points, args.point_cloud_range).sum()), int((~finite).sum())


def point_pool(cfg: DataConfig, args: PointArgs, frames: list[Frame], notes: dict[str, Any],
               drops: DropLog, splits: Optional[dict[str, list[str]]], frames_read: int) -> Pool:
    """The cleaned pool of `frames` (see the module doc); `frames_read`: the frames the folder names, those dropped
    before their labels were parsed (missing_labels, missing_calib, singular_calib) included."""
    present = [f for f in frames if f.points is not None]
    for f in frames:
        if f.points is None:
            drops.drop("missing_points", f.stem)
    with ThreadPoolExecutor(max(1, min(8, available_cpus()))) as pool:  # numpy reads release the GIL
        scans = list(pool.map(lambda f: _scan(f.points, args), present))
    class_index = {name: i for i, name in enumerate(args.classes)}
    r = args.point_cloud_range
    files, boxes, labels, difficulty, stems = [], [], [], [], []
    read_boxes = sum(len(f.names) for f in frames)
    for f, (verdict, kept_points, nonfinite) in zip(present, scans):
        if verdict != "ok":
            drops.drop("unreadable_points", str(f.points.name))
            continue
        if nonfinite:
            drops.counts["nonfinite_points"] += nonfinite
            drops.examples.setdefault("nonfinite_points", []).append(f"{f.points.name}: {nonfinite}")
        if kept_points == 0:
            drops.drop("empty_frame", str(f.points.name))
            continue
        keep = []
        for k, (box, name) in enumerate(zip(f.boxes, f.names)):
            ident = f"{f.stem} box {k}"
            if name not in class_index:
                drops.drop("unknown_class", f"{ident} ({name})")
            elif not np.all(box[3:6] > 0):
                drops.drop("bad_size", ident)
            elif not (r[0] <= box[0] < r[3] and r[1] <= box[1] < r[4] and r[2] <= box[2] < r[5]):
                drops.drop("out_of_range", ident)
            else:
                keep.append(k)
        files.append(str(f.points))
        stems.append(f.stem)
        boxes.append(f.boxes[keep].astype(np.float64).reshape(-1, 7))
        labels.append(np.asarray([class_index[f.names[k]] for k in keep], dtype=np.int64))
        if f.difficulty is not None:
            difficulty.append(f.difficulty[keep].astype(np.int64))
    per_class = np.bincount(np.concatenate([np.zeros(0, np.int64), *labels]), minlength=len(args.classes))
    grid = args.grid_size
    info = DataInfo("detection3d", "pointcloud", (args.max_voxels[0], args.max_points_per_voxel,
                                                 len(args.point_features)), "float32", len(args.classes),
                    tuple(args.classes),
                    pillar_grid=(*map(float, args.point_cloud_range), *map(float, args.voxel_size),
                                 args.max_points_per_voxel, *args.max_voxels))
    samples = PointSamples(files, boxes, labels, difficulty if len(difficulty) == len(files) else None, args)
    split_indices = None
    if splits is not None:  # ImageSets: train and val as listed; test too where its frames are here, else val
        position = {stem: i for i, stem in enumerate(stems)}
        split_indices = {name: np.asarray([position[s] for s in names if s in position], dtype=np.int64)
                         for name, names in splits.items()}
        if not len(split_indices.get("train", ())) or not len(split_indices.get("val", ())):
            split_indices = None  # nothing usable listed: trainforge's own split
            notes["image_sets"] = "ignored: no train or no val frame of this folder listed"
        else:
            if not len(split_indices.get("test", ())):
                split_indices["test"] = split_indices["val"]
                notes["image_sets"] = "test is val (ImageSets lists no test frame of this folder, as KITTI's training/)"
            listed = set(np.concatenate(list(split_indices.values())).tolist())
            notes["frames_in_no_split"] = len(stems) - len(listed)
    report = {"box_reasons": list(BOX_REASONS), "point_reasons": list(POINT_REASONS), "rows_are": "frames",
              "boxes": {"read": read_boxes, "kept": int(per_class.sum()),
                        "per_class": {n: int(c) for n, c in zip(args.classes, per_class)}},
              "grid_size": list(grid), **notes}
    return Pool(info, samples, labels=None, rows_read=frames_read, drops=drops, splits=split_indices,
                preprocess={"point_cloud_range": list(args.point_cloud_range), "voxel_size": list(args.voxel_size),
                            "max_points_per_voxel": args.max_points_per_voxel, "max_voxels": list(args.max_voxels),
                            "point_features": list(args.point_features), "classes": list(args.classes),
                            "bin_features": args.bin_features},
                notes=report)


def _stems(folder: Path, suffixes: tuple[str, ...]) -> list[str]:
    return sorted({p.stem for p in folder.iterdir() if p.is_file() and p.suffix.lower() in suffixes})


def _require_folder(root: Path, name: str, what: str) -> Path:
    folder = root / name
    if not root.is_dir() or not folder.is_dir():
        raise UserError(f"data.path: {root} has no {name}/ folder; point it at {what}", public=True)
    return folder


def _layout(cfg: DataConfig, what: str, labels: str, points: str, suffixes: tuple[str, ...]
            ) -> tuple[PointArgs, Path, Path, Path, DropLog, list[str]]:
    """What both layouts start from: the args, data.path, its labels and points folders, an empty drop log, and the
    frame names either folder holds (a frame missing from one is counted by its reason)."""
    args = parse_args(PointArgs, cfg)
    root = require_path(cfg, what)
    labels_dir = _require_folder(root, labels, what)
    points_dir = _require_folder(root, points, what)
    stems = sorted(set(_stems(labels_dir, (".txt",))) | set(_stems(points_dir, suffixes)))
    return args, root, labels_dir, points_dir, DropLog(FRAME_REASONS + BOX_REASONS + POINT_REASONS), stems


KITTI_WHAT = "a KITTI 3D object folder (velodyne/, label_2/, calib/; the training/ folder of the download)"
CUSTOM_WHAT = "a folder of OpenPCDet's custom layout (points/, labels/)"


@SOURCES.register("kitti")
def kitti(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: KITTI's velodyne/, label_2/, calib/ (image_2/, ImageSets/); args as PointArgs."""
    args, root, labels_dir, velodyne, drops, stems = _layout(cfg, KITTI_WHAT, "label_2", "velodyne", (".bin",))
    calib_dir = root / "calib"
    notes: dict[str, Any] = {"dont_care": 0, "layout": "kitti"}
    frames = []
    for stem in stems:
        label_file = labels_dir / f"{stem}.txt"
        if not label_file.is_file():
            drops.drop("missing_labels", stem)
            continue
        calib_file = calib_dir / f"{stem}.txt"
        if not calib_file.is_file():
            drops.drop("missing_calib", stem)
            continue
        try:
            calib = parse_kitti_calib(read_calib_text(calib_file))
        except CalibrationError as e:
            if "singular" in str(e):
                drops.drop("singular_calib", stem)
                continue
            raise UserError(f"{calib_file}: not a KITTI calibration ({e}); it needs P2, R0_rect and Tr_velo_to_cam "
                            "lines of 12, 9 and 12 numbers", public=True) from None
        frame = parse_kitti_labels(label_file, calib, drops, notes)
        frame.points = velodyne / f"{stem}.bin" if (velodyne / f"{stem}.bin").is_file() else None
        frames.append(frame)
    return point_pool(cfg, args, frames, notes, drops, image_sets(root), len(stems))


def read_calib_text(path: Path) -> str:
    return _small_text(path, "a KITTI calibration file", "give P2, R0_rect and Tr_velo_to_cam lines")


@SOURCES.register("pointclouds")
def pointclouds(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: OpenPCDet's points/ and labels/ (ImageSets/); args as PointArgs."""
    args, root, labels_dir, points_dir, drops, stems = _layout(cfg, CUSTOM_WHAT, "labels", "points", POINT_SUFFIXES)
    frames = []
    for stem in stems:
        label_file = labels_dir / f"{stem}.txt"
        if not label_file.is_file():
            drops.drop("missing_labels", stem)
            continue
        frame = parse_openpcdet_labels(label_file, drops)
        frame.points = _points_file(points_dir, stem)
        frames.append(frame)
    return point_pool(cfg, args, frames, {"layout": "openpcdet"}, drops, image_sets(root), len(stems))
