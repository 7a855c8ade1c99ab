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

Export and serving: the ONNX graph is the network alone (one frame's pillars in, the head's maps out); `serve` cuts
each served frame's points into pillars and decodes the maps, in numpy, as the collate and evaluation do; predict feeds
it points (`served_inputs`), and draws the frame from above (tasks/bev.py), as the report's val_images.png does.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from trainforge.tasks.base import Evaluation, ExportSignature, Feeds, Runner, Task, register_task
from trainforge.tasks.centers3d import OUTPUT_STRIDE, REGRESSION, Grid, center_loss, center_targets, decode
from trainforge.tasks.metrics3d import Found, Truth, evaluate3d

if TYPE_CHECKING:
    import torch

METRICS = ("map_bev", "map_3d", "map_center")
# the exported graph (one frame's pillars in, the head's maps out) and what `serve` gives for a batch of frames: each
# frame's decoded boxes, best first, padded to TOP_K rows (label -1, score 0)
GRAPH_INPUTS = ("voxels", "counts", "coords")
GRAPH_OUTPUTS = ("heatmap", "offset", "z", "size", "heading", "direction")
SERVED_INPUT = "points"
SERVED_OUTPUTS = ("boxes", "scores", "labels")
SHOWN_SCORE = 0.3  # predict's `objects` counts and the pictures' red boxes: detections scoring at least this
PICTURED = 4  # validation frames in the report's picture (val_images.png), 2 a row
MAX_OBJECTS = 64  # boxes a frame's targets hold (KITTI's busiest frames have about 40)
TOP_K = 100  # detections decoded a frame (KITTI's evaluation counts up to 100)
SCORE_THRESHOLD = 0.1
EXAMPLE_BOXES = 8  # the planner's example frame: boxes a frame
# an artifact's pillar settings predict accepts (data.args' own limits): a damaged or hostile one that claims more
# would have serving allocate (pillars x points a pillar x features) floats for every frame
MAX_POINTS_PER_VOXEL, MAX_VOXELS = 1024, 1_000_000


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
        if not fixed:  # evaluation's frames keep their points: compress serves them, the report draws them
            frame["points"] = np.asarray(points)
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
    # the console's per-class table: the IoU each class is held to and its three APs (by difficulty: eval.json)
    console_per_class = ("iou", "ap_bev", "ap_3d", "ap_center")
    final_only = ("per_class",)  # each class by difficulty and threshold: eval.json only
    served_batch = 1
    export_batch_size = 1
    prediction_columns = ("objects",)
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
                 "regression": torch.zeros(batch_size, MAX_OBJECTS, REGRESSION, device=device)}
        return inputs, heads, []


    # ---- export and serving: the network is the graph; pillars and decoding are numpy, in `serve`
    def export_signature(self, info: Any) -> ExportSignature:
        """One frame's pillars in (voxels (1, V, P, F), counts (1, V), coords (1, V, 2), V its own pillars), the head's
        maps out (heatmap (1, C, H, W), offset, z, size, heading, direction)."""
        return ExportSignature(GRAPH_INPUTS, GRAPH_OUTPUTS, {name: {1: "pillars"} for name in GRAPH_INPUTS})

    def served_inputs(self, info: Any) -> list[dict[str, Any]]:
        """predict serves a frame's points (N, F), any N; `serve` cuts them into the graph's pillars."""
        return [{"name": SERVED_INPUT, "shape": [-1, int(info.input_shape[-1])], "dtype": "float32",
                 "modality": info.modality}]

    def export_module(self, model: Any, info: Any) -> Any:
        from trainforge.tasks.exporting import PositionalInputs

        return PositionalInputs(model, GRAPH_INPUTS, outputs=GRAPH_OUTPUTS)

    def export_feeds(self, batch: Any, info: Any) -> Feeds:
        """Each frame's points as evaluation read them (an object array: frames have their own numbers of points)."""
        points = np.empty(len(batch[2]), dtype=object)
        for i, frame in enumerate(batch[2]):
            points[i] = np.ascontiguousarray(frame["points"], dtype=np.float32)
        return {SERVED_INPUT: points}

    def graph_feeds(self, feeds: Feeds, info: Any) -> Feeds:
        """A batch of one frame's points as the graph takes it: its pillars (evaluation's cap)."""
        (points,) = feeds.values()
        if len(points) != 1:
            raise ValueError(f"the 3D detection graph takes one frame a call, got {len(points)}")
        return pillar_feeds(np.asarray(points[0], dtype=np.float32), served_settings({"preprocess": info_record(info)}))

    def export_example(self, feeds: Feeds, info: Any) -> Feeds:
        return self.graph_feeds({k: v[:1] for k, v in feeds.items()}, info)

    def serve(self, run: Runner, feeds: Feeds, meta: dict[str, Any]) -> dict[str, np.ndarray]:
        """Each frame in turn: its points cut into pillars as the collate cuts them, the graph, and the decoding;
        boxes (B, TOP_K, 7) in the LiDAR frame, scores (B, TOP_K), labels (B, TOP_K), best first, padding label -1."""
        from trainforge.tasks.detection import pad_detections

        settings = served_settings(meta)
        grid = Grid(settings["point_cloud_range"], settings["voxel_size"], OUTPUT_STRIDE)
        (points,) = feeds.values()
        found = []
        for frame in points:
            maps = run(pillar_feeds(np.asarray(frame, dtype=np.float32), settings))
            boxes, scores, labels = decode({k: np.asarray(v)[0] for k, v in maps.items()}, grid, TOP_K,
                                           SCORE_THRESHOLD)
            found.append({"boxes": boxes.astype(np.float32), "scores": scores.astype(np.float32), "labels": labels})
        return pad_detections(found, TOP_K, 7)

    def score_outputs(self, outputs: dict[str, np.ndarray], batch: Any, info: Any) -> dict[str, Optional[float]]:
        """Compress's quality columns: map_bev, map_3d and map_center of the served boxes on the test split."""
        from trainforge.tasks.detection import unpadded

        frames = batch[2]
        found = [Found(d["boxes"].astype(np.float64), d["labels"], d["scores"].astype(np.float64))
                 for d in unpadded(outputs)]
        truths = [Truth(f["boxes"], f["labels"]) for f in frames]
        graded = [f["difficulty"] for f in frames] if frames and all("difficulty" in f for f in frames) else None
        scores = evaluate3d(truths, found, list(info.class_names), graded)
        return {name: scores[name] for name in METRICS}

    def predictions(self, outputs: dict[str, np.ndarray], meta: dict[str, Any], *, top_k: int) -> list[dict[str, Any]]:
        """Per frame: `detections` (best first: label, score, `center` x y z and `size` l w h in metres and `yaw` in
        radians, the LiDAR frame as the points give it) and `objects` (how many of each class score at least
        SHOWN_SCORE). `top_k` does not apply: a frame has as many objects as it has."""
        from collections import Counter

        from trainforge.tasks.detection import unpadded

        names = [str(c) for c in meta.get("class_names") or []]
        rows = []
        for frame in unpadded(outputs):
            detections = [{"label": names[label] if 0 <= label < len(names) else str(label), "score": round(float(score), 4),
                           "center": [round(float(v), 3) for v in box[:3]],
                           "size": [round(float(v), 3) for v in box[3:6]], "yaw": round(float(box[6]), 4)}
                          for box, score, label in zip(frame["boxes"], frame["scores"], frame["labels"].tolist())]
            objects = Counter(d["label"] for d in detections if d["score"] >= SHOWN_SCORE)
            rows.append({"objects": dict(objects.most_common()), "detections": detections})
        return rows

    def prediction_image(self, sample: Feeds, output: dict[str, np.ndarray], prediction: dict[str, Any],
                         meta: dict[str, Any]) -> Optional[np.ndarray]:
        """The frame from above, the boxes scoring at least SHOWN_SCORE in red with their class and score."""
        from trainforge.tasks.bev import bev_picture

        shown = [d for d in prediction["detections"] if d["score"] >= SHOWN_SCORE]
        boxes = np.asarray([[*d["center"], *d["size"], d["yaw"]] for d in shown], dtype=np.float64).reshape(-1, 7)
        return bev_picture(np.asarray(sample[SERVED_INPUT]), served_settings(meta)["point_cloud_range"],
                           found=boxes, labels=[f"{d['label']} {d['score']:.2f}" for d in shown])


def info_record(info: Any) -> dict[str, Any]:
    """The preprocessing record's pillar settings, from a DataInfo's pillar grid."""
    settings = pillar_settings(info)
    return {"point_cloud_range": list(settings["point_cloud_range"]), "voxel_size": list(settings["voxel_size"]),
            "max_points_per_voxel": settings["max_points"], "max_voxels": list(settings["max_voxels"])}


def served_settings(meta: dict[str, Any]) -> dict[str, Any]:
    """The pillar settings serving uses, from an artifact's metadata (the run's preprocessing record); ValueError
    naming what is missing or damaged."""
    pre = meta.get("preprocess") or {}
    try:
        point_range = [float(v) for v in pre["point_cloud_range"]]
        voxel = [float(v) for v in pre["voxel_size"]]
        max_points, max_voxels = int(pre["max_points_per_voxel"]), int(pre["max_voxels"][-1])
    except (KeyError, TypeError, ValueError, IndexError):
        raise ValueError("its preprocessing record lacks the pillar settings (point_cloud_range, voxel_size, "
                         "max_points_per_voxel, max_voxels); re-export it with `trainforge compress`") from None
    if (len(point_range) != 6 or len(voxel) != 3 or min(voxel) <= 0 or not 1 <= max_points <= MAX_POINTS_PER_VOXEL
            or not 1 <= max_voxels <= MAX_VOXELS or not all(math.isfinite(v) for v in point_range + voxel)):
        raise ValueError("its pillar settings are damaged; re-export it with `trainforge compress`")
    return {"point_cloud_range": tuple(point_range), "voxel_size": tuple(voxel), "max_points": max_points,
            "max_voxels": max_voxels}


def pillar_feeds(points: np.ndarray, settings: dict[str, Any]) -> Feeds:
    """One frame's points -> the graph's feeds: its pillars (evaluation's cap), as a batch of one; a frame without a
    point in range gets one empty pillar (count 0: it lands in the cell that is cut off)."""
    from trainforge.points3d import voxelize

    p = voxelize(points, settings["point_cloud_range"], settings["voxel_size"], settings["max_points"],
                 settings["max_voxels"])
    v = max(len(p.counts), 1)
    voxels = np.zeros((1, v, settings["max_points"], points.shape[1]), dtype=np.float32)
    counts = np.zeros((1, v), dtype=np.int64)
    coords = np.zeros((1, v, 2), dtype=np.int64)
    n = len(p.counts)
    voxels[0, :n], counts[0, :n], coords[0, :n] = p.voxels, p.counts, p.coords
    return {"voxels": voxels, "counts": counts, "coords": coords}


class Detection3DEvaluation(Evaluation):
    """Decodes each frame's maps and scores the pass with evaluate3d; the model gives no loss in eval mode."""

    def __init__(self, task: Task, class_names: tuple[str, ...], grid: Grid) -> None:
        super().__init__(task)
        self.class_names, self.grid = class_names, grid
        self.truths: list[Truth] = []
        self.found: list[Found] = []
        self.difficulty: list[np.ndarray] = []
        self.points: list[np.ndarray] = []  # the first PICTURED frames' points, for `picture`

    def add_batch(self, output: dict[str, "torch.Tensor"], batch: Any) -> None:
        maps = {k: v.detach().float().cpu().numpy() for k, v in output.items()}
        self.count += len(batch[2])
        for i, frame in enumerate(batch[2]):
            boxes, scores, labels = decode({k: v[i] for k, v in maps.items()}, self.grid, TOP_K, SCORE_THRESHOLD)
            self.found.append(Found(boxes, labels, scores))
            self.truths.append(Truth(frame["boxes"], frame["labels"]))
            if len(self.points) < PICTURED and "points" in frame:
                self.points.append(np.asarray(frame["points"]))
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

    def picture(self) -> Optional[np.ndarray]:
        """The first PICTURED frames from above: true boxes green, predicted ones scoring at least SHOWN_SCORE red
        with class and score, 2 a row (the report's val_images.png)."""
        from trainforge.tasks.bev import bev_picture, grid_of

        pictures = []
        for points, truth, found in zip(self.points, self.truths, self.found):
            shown = found.scores >= SHOWN_SCORE
            names = [f"{self.class_names[c] if 0 <= c < len(self.class_names) else c} {v:.2f}"
                     for c, v in zip(found.labels[shown].tolist(), found.scores[shown].tolist())]
            pictures.append(bev_picture(points, self.grid.point_cloud_range, truth=truth.boxes,
                                        found=found.boxes[shown], labels=names))
        return grid_of(pictures)
