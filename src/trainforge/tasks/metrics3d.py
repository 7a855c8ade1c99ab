"""3D detection metrics as pure functions (numpy): KITTI's AP|R40 in bird's-eye view and in 3D, and nuScenes'
centre-distance AP. Boxes are boxes3d's (x, y, z, l, w, h, yaw in the LiDAR frame).

A frame's ground truth is `Truth(boxes, labels, ignore)`: `ignore` marks boxes that neither count as missed nor make
a detection a false positive (KITTI: a box harder than the difficulty level evaluated, or of a neighbouring class such
as Van for Car). Detections are `Found(boxes, labels, scores)` per frame, in the same order as the truths.

- `ap_r40`: per class, detections of all frames sorted by score, each matched greedily to the unmatched ground truth
  it overlaps most (rotated BEV or 3D IoU at the class's threshold); precision interpolated (the best precision at
  any recall at least r) at the 40 recall points 1/40 .. 1, averaged (Simonelli et al., "Disentangling Monocular 3D
  Object Detection", ICCV 2019, which KITTI adopted in 2019 in place of 11 points).
- `center_distance_ap`: per class and threshold (0.5, 1, 2, 4 m), detections sorted by score, each matched to the
  nearest unmatched ground truth by the distance of the centres seen from above; precision at 101 evenly spaced
  recall points (linearly interpolated, 0 beyond the largest recall), the part above recall 0.1 and precision 0.1
  averaged and rescaled (the nuScenes detection benchmark's definition).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trainforge.boxes3d import bev_iou, iou_3d

R40 = np.arange(1, 41) / 40
CENTER_THRESHOLDS_M = (0.5, 1.0, 2.0, 4.0)
NUSCENES_MIN_RECALL = 0.1
NUSCENES_MIN_PRECISION = 0.1
# KITTI's thresholds: 0.7 for cars, 0.5 for pedestrians and cyclists; 0.5 for a class it does not know
KITTI_IOU = {"car": 0.7, "van": 0.7, "truck": 0.7}
DEFAULT_IOU = 0.5


@dataclass
class Truth:
    boxes: np.ndarray
    labels: np.ndarray
    ignore: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.boxes = np.asarray(self.boxes, dtype=np.float64).reshape(-1, 7)
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        self.ignore = (np.zeros(len(self.labels), dtype=bool) if self.ignore is None
                       else np.asarray(self.ignore, dtype=bool).reshape(-1))


@dataclass
class Found:
    boxes: np.ndarray
    labels: np.ndarray
    scores: np.ndarray

    def __post_init__(self) -> None:
        self.boxes = np.asarray(self.boxes, dtype=np.float64).reshape(-1, 7)
        self.labels = np.asarray(self.labels, dtype=np.int64).reshape(-1)
        self.scores = np.asarray(self.scores, dtype=np.float64).reshape(-1)


def iou_threshold(class_name: str) -> float:
    return KITTI_IOU.get(class_name.lower(), DEFAULT_IOU)


def _ranked_matches(truths: list[Truth], found: list[Found], label: int, similarity, accept) -> tuple[np.ndarray, int]:
    """For one class: each detection's outcome in descending score order (1 a true positive, 0 a false positive;
    one on an ignored box is dropped) and the number of ground-truth boxes that count. `similarity(detections,
    truths)` -> (D, G); a detection takes the free box most similar to it, a match where `accept(similarity)`."""
    entries = sorted((-float(s), f, i) for f, d in enumerate(found) for i, s in enumerate(d.scores)
                     if d.labels[i] == label)
    counted = sum(int(np.sum((t.labels == label) & ~t.ignore)) for t in truths)
    taken = [np.zeros(len(t.labels), dtype=bool) for t in truths]
    mine = [np.nonzero(t.labels == label)[0] for t in truths]
    cache: dict[int, np.ndarray] = {}
    outcome = []
    for _, f, i in entries:
        if f not in cache:
            cache[f] = similarity(found[f].boxes, truths[f].boxes[mine[f]])
        candidates = np.where(taken[f][mine[f]], -np.inf, cache[f][i])
        j = int(np.argmax(candidates)) if len(candidates) else -1
        if j < 0 or not accept(candidates[j]):
            outcome.append(0)
            continue
        box = mine[f][j]
        taken[f][box] = True
        if not truths[f].ignore[box]:
            outcome.append(1)
    return np.asarray(outcome, dtype=np.int64), counted


def _precision_recall(outcome: np.ndarray, counted: int) -> tuple[np.ndarray, np.ndarray]:
    tp = np.cumsum(outcome)
    fp = np.cumsum(1 - outcome)
    precision = tp / np.maximum(tp + fp, 1)
    recall = tp / counted if counted else np.zeros_like(precision, dtype=np.float64)
    return precision, recall


def ap_r40(truths: list[Truth], found: list[Found], label: int, iou: float, mode: str = "bev") -> float | None:
    """KITTI's AP|R40 of one class (0..1) with rotated IoU (`mode` bev or 3d) at least `iou`; None where no ground
    truth of the class counts."""
    outcome, counted = _ranked_matches(truths, found, label, bev_iou if mode == "bev" else iou_3d,
                                       lambda overlap: overlap >= iou)
    if counted == 0:
        return None
    if len(outcome) == 0:
        return 0.0
    precision, recall = _precision_recall(outcome, counted)
    # the best precision at a recall at least r (the envelope), 0 where that recall is never reached
    envelope = np.maximum.accumulate(precision[::-1])[::-1]
    at = np.searchsorted(recall, R40 - 1e-12, side="left")
    return float(np.mean(np.where(at < len(envelope), envelope[np.minimum(at, len(envelope) - 1)], 0.0)))


def _center_similarity(detections: np.ndarray, truths: np.ndarray) -> np.ndarray:
    d = detections[:, None, :2] - truths[None, :, :2]
    return -np.hypot(d[..., 0], d[..., 1])


def center_distance_ap(truths: list[Truth], found: list[Found], label: int, threshold_m: float) -> float | None:
    """nuScenes' AP of one class at one centre-distance threshold (metres): a match is a centre closer than the
    threshold seen from above (the nearest unmatched box, however far, is taken; too far is a false positive).
    None where no ground truth of the class counts."""
    outcome, counted = _ranked_matches(truths, found, label, _center_similarity,
                                       lambda similarity: -similarity < threshold_m)
    if counted == 0:
        return None
    if len(outcome) == 0:
        return 0.0
    precision, recall = _precision_recall(outcome, counted)
    curve = np.interp(np.linspace(0, 1, 101), recall, precision, right=0)
    kept = curve[round(100 * NUSCENES_MIN_RECALL) + 1:] - NUSCENES_MIN_PRECISION
    return float(np.mean(np.clip(kept, 0, None)) / (1 - NUSCENES_MIN_PRECISION))


def evaluate3d(truths: list[Truth], found: list[Found], classes: list[str],
               difficulty: list[np.ndarray] | None = None, iou: dict[str, float] | None = None) -> dict:
    """eval.json's numbers: map_bev and map_3d (KITTI AP|R40, each class at its IoU, moderate difficulty where the
    truths carry difficulty levels), map_center (nuScenes' centre-distance AP over 0.5, 1, 2, 4 m), per_class with
    each class's numbers, and by difficulty where known. Classes without a counted ground-truth box are left out of
    the means. `iou`: a class's IoU threshold instead of KITTI's (KITTI's second table holds cars at 0.5)."""
    per_class: dict[str, dict] = {}
    levels = (0, 1, 2) if difficulty is not None else (None,)
    for label, name in enumerate(classes):
        threshold = (iou or {}).get(name, iou_threshold(name))
        row: dict = {"iou": threshold}
        for level in levels:
            judged = truths if level is None else [
                Truth(t.boxes, t.labels, t.ignore | (d < 0) | (d > level)) for t, d in zip(truths, difficulty)]
            suffix = "" if level is None else "_" + ("easy", "moderate", "hard")[level]
            for mode in ("bev", "3d"):
                row[f"ap_{mode}{suffix}"] = ap_r40(judged, found, label, threshold, mode)
        if difficulty is not None:  # the headline is the moderate level, as KITTI ranks
            row["ap_bev"], row["ap_3d"] = row["ap_bev_moderate"], row["ap_3d_moderate"]
        centre = [center_distance_ap(truths, found, label, t) for t in CENTER_THRESHOLDS_M]
        row["ap_center"] = None if centre[0] is None else float(np.mean(centre))
        row.update({f"ap_center_{t:g}m": v for t, v in zip(CENTER_THRESHOLDS_M, centre)})
        per_class[name] = row

    def mean(key: str) -> float:
        values = [r[key] for r in per_class.values() if r.get(key) is not None]
        return float(np.mean(values)) if values else 0.0

    return {"map_bev": mean("ap_bev"), "map_3d": mean("ap_3d"), "map_center": mean("ap_center"),
            "per_class": per_class}
