"""`detection3d`: the 3D boxes and classes of the objects in a LiDAR point cloud (issue 52).

A sample is (points float32 (N, F), {"boxes": float32 (n, 7) x y z l w h yaw in the LiDAR frame, "labels": int64
(n,) indices into class_names, "difficulty": int64 (n,) where the labels carry KITTI's levels}). The collate cuts
each frame into pillars (trainforge.points3d.voxelize, numpy: predict does the same) padded to the data's pillar
cap, max_voxels[0] in training (fixed shapes: the planner simulates the step exactly) and the batch's largest frame,
up to max_voxels[1], in evaluation; and it draws CenterPoint's targets (tasks/centers3d.py). A batch is
(inputs {"voxels" (B, V, P, F), "counts" (B, V), "coords" (B, V, 2)}, targets {"heatmap", "index", "mask",
"regression"}, the frames' own boxes for evaluation).

The model (models/pointpillars.py) maps the inputs to the head's maps; the loss (focal on the heatmap, L1 on the
regressions at the centres) and the decoding (3x3 peaks, top 100) are the task's. Evaluation is KITTI's AP|R40 in
BEV and 3D and nuScenes' centre-distance AP (tasks/metrics3d.py); eval.json: map_bev, map_3d, map_center, per_class.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from trainforge.tasks.base import Evaluation, Task, register_task
from trainforge.tasks.centers3d import OUTPUT_STRIDE, Grid, center_loss, center_targets, decode
from trainforge.tasks.metrics3d import Found, Truth, evaluate3d

if TYPE_CHECKING:
    import torch

METRICS = ("map_bev", "map_3d", "map_center")
MAX_OBJECTS = 64  # boxes a frame's targets hold (KITTI's busiest frames have about 40)
TOP_K = 100  # detections decoded a frame (KITTI's evaluation counts up to 100)
SCORE_THRESHOLD = 0.1
EXAMPLE_BOXES = 8  # the planner's example frame: boxes a frame


def pillar_settings(info: Any) -> dict[str, Any]:
    """The pillar grid of a DataInfo: range, voxel size, points a pillar, pillar caps (train, eval)."""
    g = info.pillar_grid
    if len(g) != 12:
        raise ValueError("this data has no pillar grid (data_info.pillar_grid): it is not a point cloud")
    return {"point_cloud_range": tuple(g[:6]), "voxel_size": tuple(g[6:9]), "max_points": int(g[9]),
            "max_voxels": (int(g[10]), int(g[11]))}


def collate_frames(samples: list, *, point_cloud_range: tuple, voxel_size: tuple, max_points: int, max_voxels: int,
                   fixed: bool, num_classes: int, stride: int) -> tuple[dict, dict, list[dict]]:
    """See the module doc: pillars padded to max_voxels (`fixed`) or to the batch's largest frame; targets."""
    import torch

    from trainforge.points3d import voxelize

    grid = Grid(tuple(point_cloud_range), tuple(voxel_size), stride)
    pillars, targets, frames = [], [], []
    for points, target in samples:
        p = voxelize(np.asarray(points), point_cloud_range, voxel_size, max_points, max_voxels)
        boxes = np.asarray(target["boxes"], dtype=np.float64).reshape(-1, 7)
        labels = np.asarray(target["labels"], dtype=np.int64).reshape(-1)
        pillars.append(p)
        targets.append(center_targets(boxes, labels, num_classes, grid, MAX_OBJECTS))
        frame = {"boxes": boxes, "labels": labels}
        if "difficulty" in target:
            frame["difficulty"] = np.asarray(target["difficulty"], dtype=np.int64).reshape(-1)
        frames.append(frame)
    v = max_voxels if fixed else max(1, max(len(p.counts) for p in pillars))
    features = np.asarray(samples[0][0]).shape[1] if len(samples) else 4
    voxels = np.zeros((len(samples), v, max_points, features), dtype=np.float32)
    counts = np.zeros((len(samples), v), dtype=np.int64)
    coords = np.zeros((len(samples), v, 2), dtype=np.int64)
    for i, p in enumerate(pillars):
        n = len(p.counts)
        voxels[i, :n], counts[i, :n], coords[i, :n] = p.voxels, p.counts, p.coords
    inputs = {"voxels": torch.from_numpy(voxels), "counts": torch.from_numpy(counts), "coords": torch.from_numpy(coords)}
    heads = {"heatmap": torch.from_numpy(np.stack([t.heatmap for t in targets])),
             "index": torch.from_numpy(np.stack([t.index for t in targets])),
             "mask": torch.from_numpy(np.stack([t.mask for t in targets])),
             "regression": torch.from_numpy(np.stack([t.regression for t in targets]))}
    return inputs, heads, frames


@register_task
class Detection3D(Task):
    name = "detection3d"
    title = "3D object detection"
    description = "3D boxes of the objects in a LiDAR point cloud (KITTI or OpenPCDet folders; PointPillars)"
    metrics = METRICS
    default_metric = "map_bev"
    higher_is_better = frozenset(METRICS)
    quality = ("map_bev", "mAP BEV", "test BEV mAP (KITTI AP|R40)")
    chart_metrics = METRICS
    final_only = ("per_class",)  # each class by difficulty and threshold: eval.json only
    served_batch = 1
    export_batch_size = 1
    export_refusal = "3D detection's export (pillars in numpy, the network in ONNX, decoding in numpy) is not built yet"
    predict_refusal = "3D detection's export and serving are not built yet"
    distill_refusal = ("3D detection defines no distillation: its outputs are heatmaps and box regressions, not rows "
                       "of class logits; drop --distill")

    def collator(self, info: Any, train: bool) -> Any:
        settings = pillar_settings(info)
        return functools.partial(collate_frames, point_cloud_range=settings["point_cloud_range"],
                                 voxel_size=settings["voxel_size"], max_points=settings["max_points"],
                                 max_voxels=settings["max_voxels"][0 if train else 1], fixed=train,
                                 num_classes=info.num_classes, stride=OUTPUT_STRIDE)

    def collate(self, samples: list) -> Any:
        raise TypeError("detection3d batches need the data's pillar grid: use task.collator(info, train)")

    def training_loss(self, output: dict[str, "torch.Tensor"], batch: Any, *, label_smoothing: float = 0.0,
                      loss: Optional[str] = None) -> "torch.Tensor":
        t = batch[1]
        terms = center_loss(output, t["heatmap"], t["index"], t["mask"], t["regression"])
        return sum(terms.values())

    def evaluation(self, info: Any) -> Evaluation:
        settings = pillar_settings(info)
        grid = Grid(settings["point_cloud_range"], settings["voxel_size"], OUTPUT_STRIDE)
        return Detection3DEvaluation(self, tuple(info.class_names), grid)

    def example_batch(self, info: Any, inputs: Any, batch_size: int) -> Any:
        """The planner's batch: `inputs` (the model's example pillars) with targets of EXAMPLE_BOXES boxes a frame."""
        import torch

        settings = pillar_settings(info)
        grid = Grid(settings["point_cloud_range"], settings["voxel_size"], OUTPUT_STRIDE)
        rows, columns = grid.shape
        device = inputs["voxels"].device
        heads = {"heatmap": torch.zeros(batch_size, info.num_classes, rows, columns, device=device),
                 "index": torch.arange(MAX_OBJECTS, device=device).repeat(batch_size, 1),
                 "mask": (torch.arange(MAX_OBJECTS, device=device) < EXAMPLE_BOXES).float().repeat(batch_size, 1),
                 "regression": torch.zeros(batch_size, MAX_OBJECTS, 8, device=device)}
        return inputs, heads, []


class Detection3DEvaluation(Evaluation):
    """Decodes each frame's maps and scores the pass with evaluate3d; the model gives no loss in eval mode."""

    def __init__(self, task: Task, class_names: tuple[str, ...], grid: Grid) -> None:
        super().__init__(task)
        self.class_names, self.grid = class_names, grid
        self.truths: list[Truth] = []
        self.found: list[Found] = []
        self.difficulty: list[np.ndarray] = []

    def add_batch(self, output: dict[str, "torch.Tensor"], batch: Any) -> None:
        maps = {k: v.detach().float().cpu().numpy() for k, v in output.items()}
        self.count += len(batch[2])
        for i, frame in enumerate(batch[2]):
            boxes, scores, labels = decode({k: v[i] for k, v in maps.items()}, self.grid, TOP_K, SCORE_THRESHOLD)
            self.found.append(Found(boxes, labels, scores))
            self.truths.append(Truth(frame["boxes"], frame["labels"]))
            if "difficulty" in frame:
                self.difficulty.append(frame["difficulty"])

    @property
    def mean_loss(self) -> Optional[float]:
        return None

    def result(self, detailed: bool) -> dict[str, Any]:
        graded = self.difficulty if len(self.difficulty) == len(self.truths) and self.truths else None
        scores = evaluate3d(self.truths, self.found, list(self.class_names), graded)
        if not detailed:
            scores.pop("per_class")
        return scores
