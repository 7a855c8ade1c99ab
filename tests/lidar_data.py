"""Generated drives with known answers (issue 52): LiDAR sweeps of a ground plane and cuboid objects of three classes,
with their 3D boxes, calibration and a camera image, written in KITTI's 3D object layout and in OpenPCDet's custom
layout.

A scene is simulated as a spinning LiDAR sees it: a sensor at the origin, 1.73 m above a noisy ground plane, casts
rays over BEAMS elevations and an azimuth step; each ray stops at the nearest face of a cuboid or at the ground. So
points lie on the faces the sensor sees, and fall off with range as the rays spread; an object hit fewer than
MIN_POINTS times is left out. Objects stand 5-40 m away, in the
camera's field of view, apart from each other. Each scene's boxes are the truth in the LiDAR frame (x y z l w h yaw);
the KITTI labels are those boxes in the camera frame through the drive's calibration (boxes3d.lidar_to_camera), so a
reader that turns them back gets the same boxes.

    scenes = make_scenes(12, seed=0)
    write_kitti(root / "kitti", scenes)          # velodyne/ label_2/ calib/ image_2/ ImageSets/
    write_openpcdet(root / "custom", scenes)     # points/ labels/ ImageSets/
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from trainforge.boxes3d import (Calibration, bev_iou, corners_3d, format_kitti_calib, kitti_difficulty,
                                lidar_to_camera, points_in_boxes)

CLASSES = ("Car", "Pedestrian", "Cyclist")
SIZES = {"Car": (3.9, 1.6, 1.56), "Pedestrian": (0.8, 0.6, 1.73), "Cyclist": (1.76, 0.6, 1.73)}  # l, w, h (KITTI's means)
SENSOR_HEIGHT_M = 1.73
BEAMS = 32  # the sensor's beams, elevations evenly from -24 to +2 degrees
AZIMUTH_STEP_DEG = 0.35
FOV = np.deg2rad(40)  # objects are placed within +-40 degrees of ahead, which the camera sees
IMAGE_SIZE = (1242, 375)  # width, height of the rendered camera image (KITTI's)
MIN_POINTS = 5  # an object the sweep hits fewer times is left out of the scene (hidden behind another)


@dataclass
class Scene:
    points: np.ndarray      # float32 (N, 4): x, y, z, intensity
    boxes: np.ndarray       # float64 (n, 7) in the LiDAR frame
    names: list[str]        # each box's class
    calib: Calibration
    image: np.ndarray       # uint8 (H, W, 3)


def calibration(rng: np.random.Generator) -> Calibration:
    """KITTI's extrinsics (camera z = LiDAR x, camera x = -LiDAR y, camera y = -LiDAR z), slightly turned and
    offset as a real rig is, a rectifying rotation, and a camera of IMAGE_SIZE pixels."""
    a, b = rng.uniform(-0.01, 0.01, 2)
    base = np.array([[0.0, -1, 0], [0, 0, -1], [1, 0, 0]])
    tilt = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    velo = np.column_stack([tilt @ base, [0.0, -0.08, -0.27] + rng.uniform(-0.02, 0.02, 3)])
    r0 = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    w, h = IMAGE_SIZE
    f = w / 2 / np.tan(np.deg2rad(45))
    p2 = np.array([[f, 0, w / 2, 0.06 * f], [0, f, h / 2, 0.0], [0, 0, 1, 0.0]])
    return Calibration(P2=p2, R0_rect=r0, Tr_velo_to_cam=velo)


def place_objects(rng: np.random.Generator, count: int) -> tuple[np.ndarray, list[str]]:
    boxes, names = [], []
    for _ in range(count * 20):
        if len(boxes) == count:
            break
        name = CLASSES[int(rng.integers(0, 3))]
        l, w, h = np.asarray(SIZES[name]) * rng.uniform(0.9, 1.1, 3)
        distance, bearing = rng.uniform(5, 40), rng.uniform(-FOV, FOV)
        x, y = distance * np.cos(bearing), distance * np.sin(bearing)
        box = np.array([x, y, -SENSOR_HEIGHT_M + h / 2, l, w, h, rng.uniform(-np.pi, np.pi)])
        grown = box.copy()
        grown[3:5] += 1.0  # a metre between objects
        if boxes and bev_iou(grown[None], np.asarray(boxes)).max() > 0:
            continue
        boxes.append(box)
        names.append(name)
    return np.asarray(boxes).reshape(-1, 7), names


def ray_cast(boxes: np.ndarray, rng: np.random.Generator, max_range: float = 60.0, beams: int = BEAMS,
             azimuth_step_deg: float = AZIMUTH_STEP_DEG) -> np.ndarray:
    """The sweep: (N, 4) float32 points where rays first hit a box or the (noisy) ground; intensity by surface."""
    # the front half is enough for the camera's view
    azimuth = np.arange(-np.pi / 2, np.pi / 2, np.deg2rad(azimuth_step_deg))
    elev, azim = np.meshgrid(np.deg2rad(np.linspace(-24.0, 2.0, beams)), azimuth, indexing="ij")
    dirs = np.stack([np.cos(elev) * np.cos(azim), np.cos(elev) * np.sin(azim), np.sin(elev)], -1).reshape(-1, 3)
    t_ground = np.where(dirs[:, 2] < -1e-6, -SENSOR_HEIGHT_M / np.minimum(dirs[:, 2], -1e-6), np.inf)
    t_hit, surface = t_ground, np.zeros(len(dirs), dtype=np.int64)  # 0 the ground, k+1 box k
    for k, (x, y, z, l, w, h, yaw) in enumerate(boxes):
        c, s = np.cos(yaw), np.sin(yaw)
        origin = np.array([(-x) * c + (-y) * s, -(-x) * s + (-y) * c, -z])  # the sensor in the box's frame
        d = np.column_stack([dirs[:, 0] * c + dirs[:, 1] * s, -dirs[:, 0] * s + dirs[:, 1] * c, dirs[:, 2]])
        half = np.array([l, w, h]) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            t1, t2 = (-half - origin) / d, (half - origin) / d
        near = np.nanmax(np.minimum(t1, t2), axis=1)
        far = np.nanmin(np.maximum(t1, t2), axis=1)
        hit = (near <= far) & (near > 0) & (near < t_hit)
        t_hit = np.where(hit, near, t_hit)
        surface = np.where(hit, k + 1, surface)
    keep = np.isfinite(t_hit) & (t_hit < max_range)
    t = t_hit[keep] + rng.normal(0, 0.01, keep.sum())  # 1 cm of range noise
    xyz = dirs[keep] * t[:, None]
    ground = surface[keep] == 0
    xyz[ground, 2] += rng.normal(0, 0.02, ground.sum())  # the road is not flat
    intensity = np.where(ground, rng.uniform(0.05, 0.3, len(t)), rng.uniform(0.4, 0.9, len(t)))
    return np.column_stack([xyz, intensity]).astype(np.float32)


def render(boxes: np.ndarray, names: list[str], calib: Calibration) -> np.ndarray:
    """The camera's picture: sky, road, and each cuboid's faces filled by class, the farthest first."""
    w, h = IMAGE_SIZE
    image = Image.new("RGB", (w, h), (150, 180, 220))
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, h // 2, w, h], fill=(90, 90, 90))
    colours = {"Car": (200, 40, 40), "Pedestrian": (40, 200, 40), "Cyclist": (40, 40, 200)}
    faces = [(0, 1, 5, 4), (1, 2, 6, 5), (2, 3, 7, 6), (3, 0, 4, 7), (4, 5, 6, 7)]
    for k in np.argsort(-np.hypot(boxes[:, 0], boxes[:, 1])):
        pixels, depth = calib.lidar_to_image(corners_3d(boxes[k][None])[0])
        if np.any(depth <= 0.1):
            continue
        for face in faces:
            draw.polygon([tuple(pixels[i]) for i in face], fill=colours[names[k]], outline=(0, 0, 0))
    return np.asarray(image)


def make_scenes(n: int, seed: int = 0, objects: tuple[int, int] = (2, 6), beams: int = BEAMS,
                azimuth_step_deg: float = AZIMUTH_STEP_DEG) -> list[Scene]:
    """`n` scenes; `beams` and `azimuth_step_deg` the sensor's resolution (32 and 0.35 by default; KITTI's HDL-64E
    has 64 beams and about 0.09 degrees)."""
    rng = np.random.default_rng(seed)
    scenes = []
    for _ in range(n):
        calib = calibration(rng)
        boxes, names = place_objects(rng, int(rng.integers(objects[0], objects[1] + 1)))
        points = ray_cast(boxes, rng, beams=beams, azimuth_step_deg=azimuth_step_deg)
        seen = points_in_boxes(points, boxes).sum(0) >= MIN_POINTS
        if not seen.all():  # a hidden object is no object: the sweep again without it
            boxes, names = boxes[seen], [n for n, k in zip(names, seen) if k]
            points = ray_cast(boxes, rng, beams=beams, azimuth_step_deg=azimuth_step_deg)
        scenes.append(Scene(points, boxes, names, calib, render(boxes, names, calib)))
    return scenes


def kitti_label_lines(scene: Scene) -> list[str]:
    """KITTI label_2 rows: type truncated occluded alpha x1 y1 x2 y2 h w l x y z rotation_y (8 decimals, so the
    boxes come back within 1e-7)."""
    rows = lidar_to_camera(scene.boxes, scene.calib)
    lines = []
    for name, box, (h, w, l, x, y, z, ry) in zip(scene.names, scene.boxes, rows):
        pixels, _ = scene.calib.lidar_to_image(corners_3d(box[None])[0])
        x1, y1 = np.clip(pixels.min(0), 0, IMAGE_SIZE)
        x2, y2 = np.clip(pixels.max(0), 0, IMAGE_SIZE)
        alpha = ry - np.arctan2(x, z)
        values = [alpha, x1, y1, x2, y2, h, w, l, x, y, z, ry]
        lines.append(f"{name} 0.00 0 " + " ".join(f"{v:.8f}" for v in values))
    return lines


def split_names(n: int) -> dict[str, list[str]]:
    """Frames 0..n-1 in ImageSets order: 70% train, 15% val, 15% test, in order."""
    ids = [f"{i:06d}" for i in range(n)]
    a, b = int(n * 0.7), int(n * 0.85)
    return {"train": ids[:a], "val": ids[a:b], "test": ids[b:]}


def write_image_sets(root: Path, n: int) -> None:
    (root / "ImageSets").mkdir(parents=True, exist_ok=True)
    for split, ids in split_names(n).items():
        (root / "ImageSets" / f"{split}.txt").write_text("".join(f"{i}\n" for i in ids))


def write_kitti(root: Path, scenes: list[Scene], dont_care: bool = True) -> Path:
    """KITTI's training/ layout in `root`: velodyne/*.bin, label_2/*.txt, calib/*.txt, image_2/*.png, ImageSets/.
    `dont_care`: each frame's labels end with a DontCare region, as KITTI's do."""
    for sub in ("velodyne", "label_2", "calib", "image_2"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i, scene in enumerate(scenes):
        stem = f"{i:06d}"
        scene.points.astype(np.float32).tofile(root / "velodyne" / f"{stem}.bin")
        lines = kitti_label_lines(scene)
        if dont_care:
            lines.append("DontCare -1 -1 -10 100.00 40.00 120.00 50.00 -1 -1 -1 -1000 -1000 -1000 -10")
        (root / "label_2" / f"{stem}.txt").write_text("\n".join(lines) + "\n")
        (root / "calib" / f"{stem}.txt").write_text(format_kitti_calib(scene.calib))
        Image.fromarray(scene.image).save(root / "image_2" / f"{stem}.png")
    write_image_sets(root, len(scenes))
    return root


def write_points(path: Path, points: np.ndarray) -> Path:
    """A frame's (N, 4) points as a .npy, .bin (float32 records) or .pcd file (x, y, z, intensity, through pypcd4)."""
    points = np.ascontiguousarray(points, dtype=np.float32)
    if path.suffix == ".npy":
        np.save(path, points)
    elif path.suffix == ".bin":
        points.tofile(path)
    elif path.suffix == ".pcd":
        from pypcd4 import PointCloud

        PointCloud.from_xyzi_points(points).save(path)
    else:
        raise ValueError(f"no points format {path.suffix}")
    return path


def write_openpcdet(root: Path, scenes: list[Scene], suffix: str = ".npy") -> Path:
    """OpenPCDet's custom layout: points/*.npy (or .bin, or .pcd), labels/*.txt of `x y z dx dy dz heading class`,
    ImageSets/."""
    (root / "points").mkdir(parents=True, exist_ok=True)
    (root / "labels").mkdir(parents=True, exist_ok=True)
    for i, scene in enumerate(scenes):
        stem = f"{i:06d}"
        write_points(root / "points" / f"{stem}{suffix}", scene.points)
        (root / "labels" / f"{stem}.txt").write_text("".join(
            " ".join(f"{v:.8f}" for v in box) + f" {name}\n" for box, name in zip(scene.boxes, scene.names)))
    write_image_sets(root, len(scenes))
    return root


def difficulty_of(scene: Scene) -> np.ndarray:
    """The KITTI difficulty of each box as its label row says (its 2D height; truncation and occlusion 0)."""
    heights = []
    for box in scene.boxes:
        pixels, _ = scene.calib.lidar_to_image(corners_3d(box[None])[0])
        y = np.clip(pixels[:, 1], 0, IMAGE_SIZE[1])
        heights.append(y.max() - y.min())
    return kitti_difficulty(np.asarray(heights), np.zeros(len(heights)), np.zeros(len(heights)))
