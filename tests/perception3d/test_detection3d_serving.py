"""A trained PointPillars through compress and predict (issue 52, acceptance 7): the ONNX graph (pillars in, the
head's maps out) with voxelization and decoding in numpy gives PyTorch's boxes on every frame, `trainforge predict`
serves them from `.bin` files in a fresh process that never imports torch, and draws the BEV picture; compress
scores the fp32 variant as evaluation scored the model. The report's `val_images.png` is the BEV picture too."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trainforge
from no_torch import NO_TORCH
from lidar_data import CLASSES, make_scenes, write_kitti, write_points
from test_detection3d_runs import overrides
from trainforge.compression.artifact import input_specs
from trainforge.compression.options import CompressOptions
from trainforge.compression.pipeline import compress
from trainforge.compression.predict import load_artifact
from trainforge.points3d import model_points, read_points
from trainforge.tasks.centers3d import OUTPUT_STRIDE, Grid, decode
from trainforge.tasks.detection3d import SCORE_THRESHOLD, TOP_K, collate_frames, pillar_settings
from trainforge.training.artifacts import load_trained

FRAMES = 16


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    drives = write_kitti(root / "kitti", make_scenes(FRAMES, seed=3))
    cfg = trainforge.load_config(None, overrides(drives, "train.max_steps=30", "train.eval_every_steps=30",
                                                 "log.report=true"))
    run = root / "run"
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    doc = compress(run, options=CompressOptions(quantize="int8", bench_s=0.1))
    return drives, run, doc


def torch_detections(run: Path, files: list[Path]) -> list[dict[str, np.ndarray]]:
    """Each frame through what evaluation runs: the source's reading, the eval collate, the PyTorch model, decode."""
    trained = load_trained(run / "final")
    model = trained.build_model().eval()
    settings = pillar_settings(trained.info)
    pre = trained.preprocess
    grid = Grid(settings["point_cloud_range"], settings["voxel_size"], OUTPUT_STRIDE)
    out = []
    for file in files:
        points = model_points(read_points(file), pre["point_cloud_range"], pre["point_features"])
        inputs, _, _ = collate_frames([(points, {"boxes": np.zeros((0, 7)), "labels": np.zeros(0, np.int64)})],
                                      point_cloud_range=settings["point_cloud_range"],
                                      voxel_size=settings["voxel_size"], max_points=settings["max_points"],
                                      max_voxels=settings["max_voxels"][1], fixed=False,
                                      num_classes=trained.info.num_classes, stride=OUTPUT_STRIDE)
        with torch.no_grad():
            maps = {k: v[0].numpy() for k, v in model(inputs).items()}
        boxes, scores, labels = decode(maps, grid, TOP_K, SCORE_THRESHOLD)
        out.append({"boxes": boxes, "scores": scores, "labels": labels})
    return out


def matched(a: dict[str, np.ndarray], b: list[dict], names: list[str], margin: float = 2e-3) -> int:
    """Every detection of `a` scoring clearly above the threshold has one in `b` of its class within the bars
    (centre and size 1 cm, yaw 1e-3, score 1e-3); how many were checked."""
    checked = 0
    for box, score, label in zip(a["boxes"], a["scores"], a["labels"]):
        if score < SCORE_THRESHOLD + margin:
            continue  # a box at the threshold may fall on either side of it in the other runtime
        same = [d for d in b if d["label"] == names[label] and np.abs(np.subtract(d["center"], box[:3])).max() < 0.01]
        assert len(same) == 1, (box, score, same)
        d = same[0]
        assert np.abs(np.subtract(d["size"], box[3:6])).max() < 0.01 and abs(d["score"] - score) < 1e-3
        assert abs((d["yaw"] - box[6] + np.pi) % (2 * np.pi) - np.pi) < 1e-3 + 1e-4  # the JSON keeps 4 decimals
        checked += 1
    return checked


def test_predict_serves_pytorchs_boxes_from_bin_files_without_torch(served, tmp_path):
    drives, run, doc = served
    files = sorted((drives / "velodyne").glob("*.bin"))
    script = tmp_path / "no_torch.py"
    script.write_text(NO_TORCH)
    pictures = tmp_path / "pictures"
    proc = subprocess.run([sys.executable, str(script), "predict", str(run / "compressed" / "fp32.onnx"),
                           *map(str, files), "--json", "--images", str(pictures)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH_MODULES=[]" in proc.stderr, proc.stderr
    predictions = json.loads(proc.stdout)["predictions"]
    assert [p["input"] for p in predictions] == [str(f) for f in files]
    names = list(CLASSES)
    reference = torch_detections(run, files)
    checked = 0
    for want, got in zip(reference, predictions):
        checked += matched(want, got["detections"], names)
        # and the other way: nothing served that PyTorch did not find
        back = {"boxes": np.asarray([[*d["center"], *d["size"], d["yaw"]] for d in got["detections"]]).reshape(-1, 7),
                "scores": np.asarray([d["score"] for d in got["detections"]]),
                "labels": np.asarray([names.index(d["label"]) for d in got["detections"]], dtype=np.int64)}
        served_back = [{"label": names[l], "center": b[:3].tolist(), "size": b[3:6].tolist(), "yaw": float(b[6]),
                        "score": float(s)} for b, s, l in zip(want["boxes"], want["scores"], want["labels"])]
        matched(back, served_back, names, margin=2e-3)
    assert checked >= FRAMES, checked  # boxes were compared, not an empty list against another
    for f, p in zip(files, predictions):
        picture = pictures / f"{f.stem}.png"
        assert p["image"] == str(picture) and picture.stat().st_size > 1000
        assert set(p["objects"]) <= set(names)
    # the same frames as .npy and .pcd files: the same detections as from the .bin
    others = []
    for f in files[:3]:
        points = np.fromfile(f, dtype=np.float32).reshape(-1, 4)
        others += [write_points(tmp_path / f"{f.stem}.npy", points), write_points(tmp_path / f"{f.stem}.pcd", points)]
    proc = subprocess.run([sys.executable, "-m", "trainforge", "predict", str(run / "compressed" / "fp32.onnx"),
                           *map(str, others), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)["predictions"]
    for i, p in enumerate(again):
        assert p["detections"] == predictions[i // 2]["detections"], others[i]


def test_compress_scores_the_served_model_as_evaluation_scored_it(served):
    _, run, doc = served
    ev = json.loads((run / "eval.json").read_text())
    fp32 = next(v for v in doc["variants"] if v["name"] == "fp32")
    assert fp32["map_bev"] == pytest.approx(ev["map_bev"], abs=0.01) and fp32["map_center"] == pytest.approx(
        ev["map_center"], abs=0.01)
    assert ev["map_center"] > 0  # the model finds objects: the two numbers are not both zero
    int8 = next(v for v in doc["variants"] if v["name"] == "int8")
    assert int8["map_bev"] is not None
    recommended = next(v for v in doc["variants"] if v["name"] == doc["recommendation"]["variant"])
    assert recommended["name"] == "fp32" or fp32["map_bev"] - recommended["map_bev"] <= 0.01  # int8 only within 1 point
    artifact = load_artifact(run / "compressed" / "fp32.onnx")
    assert [i["name"] for i in input_specs(artifact.meta)] == ["points"]
    assert [i.name for i in artifact.session.get_inputs()] == ["voxels", "counts", "coords"]


def test_the_report_draws_validation_frames_from_above(served):
    _, run, _ = served
    from PIL import Image

    picture = np.asarray(Image.open(run / "val_images.png").convert("RGB"))
    green = (picture[..., 1] > 180) & (picture[..., 0] < 100)
    assert picture.shape[0] > 300 and green.sum() > 50  # true boxes drawn in green over the points


def test_an_artifact_whose_pillar_settings_claim_too_much_is_one_line(served, tmp_path):
    """A damaged or hostile artifact claiming 10^9 points a pillar would have serving allocate that much for every
    frame: predict refuses it in one line, exit 2."""
    import onnx

    from trainforge.compression import artifact
    from trainforge.integrity import write_manifest

    drives, run, _ = served
    loaded = load_artifact(run / "compressed" / "fp32.onnx")
    meta = dict(loaded.meta, preprocess={**loaded.meta["preprocess"], "max_points_per_voxel": 10 ** 9})
    proto = onnx.load(run / "compressed" / "fp32.onnx")
    artifact.embed_meta(proto, meta)
    (tmp_path / "bad").mkdir()
    onnx.save(proto, tmp_path / "bad" / "fp32.onnx")
    write_manifest(tmp_path / "bad")
    frame = sorted((drives / "velodyne").glob("*.bin"))[0]
    proc = subprocess.run([sys.executable, "-m", "trainforge", "predict", str(tmp_path / "bad" / "fp32.onnx"),
                           str(frame)], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "pillar settings are damaged" in lines[0], proc.stderr
