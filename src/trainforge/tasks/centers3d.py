"""CenterPoint's targets, loss and decoding for 3D boxes on a BEV grid (the detection3d task's arithmetic; targets
and decoding in numpy, so the training collate and `trainforge predict` share them; the loss in torch).

The head predicts, on the BEV grid at `stride` cells of the voxel grid (map cell (row, column) covers
x in [x_min + column * dx * stride, ...), y likewise):
  heatmap  (C, H, W): a centre of class c near the cell (logits; the target a Gaussian around each box's centre,
           CenterNet's radius for its size, peak 1 at the centre's cell)
  offset   (2, H, W): the centre's x, y within its cell, in cells (0..1)
  z        (1, H, W): the centre's height, metres
  size     (3, H, W): log of l, w, h, metres
  heading  (2, H, W): sin and cos of twice the yaw: the box's axis, which a cuboid's points show (yaw and yaw + pi
           give the same footprint, so a regression of sin and cos of the yaw itself is pulled to 0 by the two)
  direction (1, H, W): a logit that the heading is the axis angle (in (-pi/2, pi/2]) rather than it plus pi,
           OpenPCDet's direction classifier

    t = center_targets(boxes, labels, num_classes, Grid(point_cloud_range, voxel_size, stride=2), max_objects=64)
    loss = center_loss(maps, t)                       # focal on the heatmap + L1 on the regressions at the centres
    boxes, scores, labels = decode(maps_numpy, grid)  # peaks (3x3 local maxima) -> top-k boxes in the LiDAR frame
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

REGRESSION = 9  # offset x, y; z; log l, w, h; sin 2 yaw, cos 2 yaw; the direction (1: yaw in (-pi/2, pi/2])
DIRECTION_WEIGHT = 0.2  # the direction classifier's share of the loss (OpenPCDet's dir_weight)
OUTPUT_STRIDE = 2  # the head's maps are at half the pillar grid's resolution (models/pointpillars.py)
MIN_RADIUS = 2  # cells: the smallest Gaussian drawn (CenterPoint's min_radius)
MIN_OVERLAP = 0.1  # CenterNet's radius: the centre may move this far while the box keeps this IoU with the truth


@dataclass(frozen=True)
class Grid:
    point_cloud_range: tuple[float, ...]
    voxel_size: tuple[float, ...]
    stride: int = 2

    @property
    def cell_m(self) -> tuple[float, float]:
        return self.voxel_size[0] * self.stride, self.voxel_size[1] * self.stride

    @property
    def shape(self) -> tuple[int, int]:
        """(rows H, columns W) of the head's maps."""
        r = self.point_cloud_range
        columns = int(round((r[3] - r[0]) / self.voxel_size[0])) // self.stride
        rows = int(round((r[4] - r[1]) / self.voxel_size[1])) // self.stride
        return rows, columns


def gaussian_radius(length_cells: float, width_cells: float, min_overlap: float = MIN_OVERLAP) -> float:
    """CenterNet's radius (Zhou et al., "Objects as Points", 2019; its three cases of a corner moved within r): the
    smallest of the three quadratic roots, for a box of this size in cells."""
    h, w = length_cells, width_cells
    b1, c1 = h + w, w * h * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + math.sqrt(b1 ** 2 - 4 * c1)) / 2
    b2, c2 = 2 * (h + w), (1 - min_overlap) * w * h
    r2 = (b2 + math.sqrt(b2 ** 2 - 16 * c2)) / 2
    a3 = 4 * min_overlap
    b3, c3 = -2 * min_overlap * (h + w), (min_overlap - 1) * w * h
    r3 = (b3 + math.sqrt(b3 ** 2 - 4 * a3 * c3)) / 2
    return min(r1, r2, r3)


@dataclass
class Targets:
    heatmap: np.ndarray     # float32 (C, H, W)
    index: np.ndarray       # int64 (K,): row * W + column of each box's centre cell (0 for an empty slot)
    mask: np.ndarray        # float32 (K,): 1 for a box, 0 for an empty slot
    regression: np.ndarray  # float32 (K, REGRESSION)


def center_targets(boxes: np.ndarray, labels: np.ndarray, num_classes: int, grid: Grid, max_objects: int) -> Targets:
    """The head's targets for one frame's boxes (n, 7) of classes `labels` (n,); boxes whose centre is off the grid
    are left out, and beyond `max_objects` the rest (a frame has tens)."""
    rows, columns = grid.shape
    dx, dy = grid.cell_m
    r = grid.point_cloud_range
    heatmap = np.zeros((num_classes, rows, columns), dtype=np.float32)
    index = np.zeros(max_objects, dtype=np.int64)
    mask = np.zeros(max_objects, dtype=np.float32)
    regression = np.zeros((max_objects, REGRESSION), dtype=np.float32)
    k = 0
    yy, xx = np.mgrid[0:rows, 0:columns]
    for box, label in zip(np.asarray(boxes, dtype=np.float64).reshape(-1, 7), np.asarray(labels).reshape(-1)):
        cx, cy = (box[0] - r[0]) / dx, (box[1] - r[1]) / dy  # the centre in map cells
        column, row = int(math.floor(cx)), int(math.floor(cy))
        if not (0 <= column < columns and 0 <= row < rows) or k == max_objects:
            continue
        radius = max(MIN_RADIUS, int(gaussian_radius(box[3] / dx, box[4] / dy)))
        sigma = (2 * radius + 1) / 6
        near = (np.abs(xx - column) <= radius) & (np.abs(yy - row) <= radius)
        g = np.exp(-((xx - column) ** 2 + (yy - row) ** 2) / (2 * sigma ** 2)) * near
        heatmap[int(label)] = np.maximum(heatmap[int(label)], g.astype(np.float32))
        index[k] = row * columns + column
        mask[k] = 1.0
        yaw = math.atan2(math.sin(box[6]), math.cos(box[6]))  # in (-pi, pi]
        regression[k] = [cx - column, cy - row, box[2], math.log(box[3]), math.log(box[4]), math.log(box[5]),
                         math.sin(2 * yaw), math.cos(2 * yaw), float(-math.pi / 2 < yaw <= math.pi / 2)]
        k += 1
    return Targets(heatmap, index, mask, regression)


def gather(maps: "torch.Tensor", index: "torch.Tensor") -> "torch.Tensor":
    """(B, C, H, W) maps at (B, K) flat cell indices -> (B, K, C)."""
    b, c = maps.shape[:2]
    flat = maps.reshape(b, c, -1)
    return flat.gather(2, index.unsqueeze(1).expand(-1, c, -1)).transpose(1, 2)


def regression_of(maps: dict[str, "torch.Tensor"]) -> "torch.Tensor":
    """The 8 regressed channels (offset, z, size, heading) of the head's maps, (B, 8, H, W)."""
    import torch

    return torch.cat([maps["offset"], maps["z"], maps["size"], maps["heading"]], dim=1)


def focal_loss(logits: "torch.Tensor", target: "torch.Tensor", alpha: float = 2.0, beta: float = 4.0) -> "torch.Tensor":
    """CenterNet's penalty-reduced focal loss over the heatmap, summed and divided by the number of centres (cells
    whose target is 1)."""
    import torch
    import torch.nn.functional as F

    logits = logits.float()
    p = torch.sigmoid(logits)
    log_p, log_not_p = F.logsigmoid(logits), F.logsigmoid(-logits)
    positive = target.eq(1).float()
    pos = -(log_p * (1 - p) ** alpha) * positive
    neg = -(log_not_p * p ** alpha * (1 - target) ** beta) * (1 - positive)
    return (pos.sum() + neg.sum()) / positive.sum().clamp_min(1.0)


def center_loss(maps: dict[str, "torch.Tensor"], heatmap: "torch.Tensor", index: "torch.Tensor", mask: "torch.Tensor",
                regression: "torch.Tensor", regression_weight: float = 0.25) -> dict[str, "torch.Tensor"]:
    """{"heatmap": focal loss, "regression": L1 of the 8 regressed values at the boxes' centre cells, per box,
    "direction": the direction classifier's binary cross-entropy there}."""
    import torch.nn.functional as F

    predicted = gather(regression_of(maps).float(), index)  # (B, K, 8)
    boxes = mask.sum().clamp_min(1.0)
    l1 = ((predicted - regression[..., :8]).abs() * mask.unsqueeze(-1)).sum() / boxes
    direction = gather(maps["direction"].float(), index)[..., 0]  # (B, K) logits
    bce = (F.binary_cross_entropy_with_logits(direction, regression[..., 8], reduction="none") * mask).sum() / boxes
    return {"heatmap": focal_loss(maps["heatmap"], heatmap), "regression": regression_weight * l1,
            "direction": DIRECTION_WEIGHT * bce}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def peaks(heat: np.ndarray) -> np.ndarray:
    """(C, H, W) scores kept where a cell is the maximum of its 3x3 neighbourhood (CenterNet's max-pool NMS), else 0."""
    c, h, w = heat.shape
    padded = np.pad(heat, ((0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    windows = np.stack([padded[:, i:i + h, j:j + w] for i in range(3) for j in range(3)])
    return np.where(heat >= windows.max(0), heat, 0.0)


def decode(maps: dict[str, np.ndarray], grid: Grid, top_k: int = 100, score_threshold: float = 0.1
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One frame's maps (each (C, H, W), heatmap as logits) -> boxes (k, 7) in the LiDAR frame, scores (k,), labels
    (k,), best first: the top_k local maxima of the heatmap scoring at least score_threshold. Ties keep the lower
    class, then the lower cell."""
    rows, columns = grid.shape
    dx, dy = grid.cell_m
    r = grid.point_cloud_range
    scores = peaks(_sigmoid(np.asarray(maps["heatmap"], dtype=np.float64))).reshape(-1)
    order = np.argsort(-scores, kind="stable")[:top_k]
    order = order[scores[order] >= score_threshold]
    label, cell = np.divmod(order, rows * columns)
    row, column = np.divmod(cell, columns)
    off = np.asarray(maps["offset"], dtype=np.float64).reshape(2, -1)[:, cell]
    z = np.asarray(maps["z"], dtype=np.float64).reshape(-1)[cell]
    size = np.exp(np.asarray(maps["size"], dtype=np.float64).reshape(3, -1)[:, cell])
    heading = np.asarray(maps["heading"], dtype=np.float64).reshape(2, -1)[:, cell]
    forward = np.asarray(maps["direction"], dtype=np.float64).reshape(-1)[cell] >= 0
    x = (column + off[0]) * dx + r[0]
    y = (row + off[1]) * dy + r[1]
    axis = np.arctan2(heading[0], heading[1]) / 2  # in (-pi/2, pi/2]
    yaw = np.where(forward, axis, np.where(axis > 0, axis - np.pi, axis + np.pi))
    boxes = np.column_stack([x, y, z, size[0], size[1], size[2], yaw]).reshape(-1, 7)
    return boxes, scores[order], label.astype(np.int64)


def maps_of(targets: Targets, grid: Grid, confident: float = 8.0) -> dict[str, np.ndarray]:
    """Maps a perfect head would give for these targets (heatmap logits +-`confident`; the regressions at the
    centres): what decode must turn back into the boxes."""
    rows, columns = grid.shape
    heat = np.where(targets.heatmap >= 1, confident, -confident).astype(np.float32)
    out = {"heatmap": heat}
    flat = np.zeros((REGRESSION, rows * columns), dtype=np.float32)
    live = targets.mask > 0
    flat[:, targets.index[live]] = targets.regression[live].T
    flat = flat.reshape(REGRESSION, rows, columns)
    direction = np.where(flat[8:9] > 0.5, confident, -confident).astype(np.float32)
    out.update(offset=flat[0:2], z=flat[2:3], size=flat[3:6], heading=flat[6:8], direction=direction)
    return out
