"""3D detection metrics (trainforge/tasks/metrics3d.py, issue 52): KITTI's AP|R40 on hand-built cases, and nuScenes'
centre-distance AP against nuscenes-devkit's own `accumulate` and `calc_ap` on the same detections (1e-6). The devkit
pins numpy<2, so it lives in a venv of its own that `make test` creates (.venv-nuscenes); the comparison runs there,
in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from trainforge.tasks.metrics3d import (CENTER_THRESHOLDS_M, Found, Truth, ap_r40, center_distance_ap,
                                        evaluate3d)

NUSCENES_PYTHON = Path(os.environ.get("TRAINFORGE_NUSCENES_PYTHON",
                                      Path(__file__).resolve().parents[2] / ".venv-nuscenes" / "bin" / "python"))
CLASSES = ["car", "pedestrian", "bicycle"]  # names nuScenes' devkit knows


def frame(rng: np.random.Generator, n: int) -> np.ndarray:
    sizes = np.array([[4.0, 1.8, 1.5], [0.8, 0.6, 1.8], [1.8, 0.6, 1.7]])
    labels = rng.integers(0, 3, n)
    centres = np.column_stack([rng.uniform(5, 40, n), rng.uniform(-15, 15, n), rng.uniform(-1.5, -0.5, n)])
    return np.column_stack([centres, sizes[labels], rng.uniform(-np.pi, np.pi, n), labels])


def test_ap_r40_is_one_for_perfect_detections_and_known_on_a_hand_built_case():
    rng = np.random.default_rng(1)
    frames = [frame(rng, 6) for _ in range(4)]
    truths = [Truth(f[:, :7], f[:, 7]) for f in frames]
    perfect = [Found(f[:, :7], f[:, 7], rng.uniform(0.5, 1, len(f))) for f in frames]
    for label in range(3):
        for mode in ("bev", "3d"):
            assert ap_r40(truths, perfect, label, 0.7, mode) == pytest.approx(1.0)
    # four cars; two found (scores 0.8, 0.7), and a false positive ranked first (0.9, nowhere near a car): precision
    # 0 at recall 0, 1/2 at 1/4, 2/3 at 1/2, nothing beyond: the envelope is 2/3 on 20 of the 40 recall points
    cars = np.array([[10, 0, -1, 4, 1.8, 1.5, 0], [20, 5, -1, 4, 1.8, 1.5, 1], [30, -5, -1, 4, 1.8, 1.5, 2],
                     [15, 10, -1, 4, 1.8, 1.5, 0.5]])
    truth = [Truth(cars[:2], [0, 0]), Truth(cars[2:], [0, 0])]
    found = [Found(np.stack([cars[0], [0, 30, -1, 4, 1.8, 1.5, 0]]), [0, 0], [0.8, 0.9]), Found(cars[2:3], [0], [0.7])]
    assert ap_r40(truth, found, 0, 0.7) == pytest.approx(20 / 40 * 2 / 3)
    # the same with the unfound cars ignored (too hard for the level evaluated): recall 1 at precision 2/3
    ignored = [Truth(cars[:2], [0, 0], [False, True]), Truth(cars[2:], [0, 0], [False, True])]
    assert ap_r40(ignored, found, 0, 0.7) == pytest.approx(2 / 3)
    # a detection on an ignored box is neither a hit nor a false positive
    on_ignored = [Found(cars[:2], [0, 0], [0.8, 0.95]), Found(cars[2:3], [0], [0.7])]
    assert ap_r40(ignored, on_ignored, 0, 0.7) == pytest.approx(1.0)
    # each car found half its length ahead: BEV IoU 1/3, below 0.7 and above 0.3
    ahead = cars.copy()
    ahead[:, 0] += 2 * np.cos(cars[:, 6])
    ahead[:, 1] += 2 * np.sin(cars[:, 6])
    shifted = [Found(ahead[:2], [0, 0], [0.8, 0.7]), Found(ahead[2:], [0, 0], [0.9, 0.6])]
    assert ap_r40(truth, shifted, 0, 0.7) == 0.0 and ap_r40(truth, shifted, 0, 0.3) == pytest.approx(1.0)
    assert ap_r40(truth, found, 1, 0.5) is None  # no pedestrian to find


def nuscenes_devkit_ap(frames: list[dict], tmp_path: Path) -> dict:
    if not NUSCENES_PYTHON.exists():
        pytest.skip(f"nuscenes-devkit is not installed at {NUSCENES_PYTHON} (`make test` creates .venv-nuscenes; it pins "
                    "numpy<2, so it cannot share the test venv)")
    doc = {"classes": CLASSES, "thresholds": list(CENTER_THRESHOLDS_M), "frames": frames}
    done = subprocess.run([str(NUSCENES_PYTHON), str(Path(__file__).with_name("nuscenes_reference.py"))],
                          input=json.dumps(doc), capture_output=True, text=True, timeout=300,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_center_distance_ap_equals_nuscenes_devkits_on_the_same_detections(tmp_path):
    """40 frames of three classes; detections near the truth (noise from 0.1 to 3 m, so every threshold matters),
    some missed, false positives among them, random scores."""
    rng = np.random.default_rng(7)
    frames, truths, found = [], [], []
    for _ in range(40):
        truth = frame(rng, int(rng.integers(0, 8)))
        keep = truth[rng.random(len(truth)) < 0.8]
        noisy = keep.copy()
        noisy[:, :2] += rng.normal(0, 1, (len(keep), 2)) * rng.choice([0.1, 0.5, 1.5, 3.0], (len(keep), 1))
        extra = frame(rng, int(rng.integers(0, 3)))
        detections = np.concatenate([noisy, extra])
        scores = rng.random(len(detections))
        frames.append({"truth": truth.tolist(), "found": np.column_stack([detections, scores]).tolist()})
        truths.append(Truth(truth[:, :7], truth[:, 7]))
        found.append(Found(detections[:, :7], detections[:, 7], scores))
    want = nuscenes_devkit_ap(frames, tmp_path)
    checked = 0
    for label, name in enumerate(CLASSES):
        for threshold in CENTER_THRESHOLDS_M:
            got = center_distance_ap(truths, found, label, threshold)
            assert got == pytest.approx(want[name][str(threshold)], abs=1e-6), (name, threshold)
            checked += got > 0
    assert checked >= 9  # the comparison is of real values, not zeros
    ev = evaluate3d(truths, found, CLASSES)
    assert ev["map_center"] == pytest.approx(np.mean([want[n][str(t)] for n in CLASSES for t in CENTER_THRESHOLDS_M]),
                                             abs=1e-6)


def test_evaluate3d_gives_eval_jsons_keys_and_kittis_levels():
    rng = np.random.default_rng(3)
    frames = [frame(rng, 5) for _ in range(3)]
    truths = [Truth(f[:, :7], f[:, 7]) for f in frames]
    found = [Found(f[:, :7], f[:, 7], np.linspace(1, 0.5, len(f))) for f in frames]
    ev = evaluate3d(truths, found, CLASSES)
    assert {"map_bev", "map_3d", "map_center", "per_class"} <= set(ev)
    assert ev["map_bev"] == pytest.approx(1.0) and ev["map_3d"] == pytest.approx(1.0)
    levels = [np.array([0, 1, 2, -1, 0]) for _ in frames]
    graded = evaluate3d(truths, found, CLASSES, difficulty=levels)
    row = graded["per_class"]["car"]
    assert {"ap_bev_easy", "ap_bev_moderate", "ap_bev_hard", "ap_3d_moderate"} <= set(row)
    assert row["ap_bev"] == row["ap_bev_moderate"] and row["iou"] == 0.7 and graded["per_class"]["bicycle"]["iou"] == 0.5
