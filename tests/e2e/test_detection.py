"""Detection end to end (issues 28 and 55): a small torchvision Faster R-CNN learns generated shapes on 3:1 frames
from COCO, YOLO and VOC folders alike, their aspect kept (at least as well as stretched); `trainforge eval` gives the
run's numbers again; compress exports it to ONNX, whose detections agree with PyTorch's, and `trainforge predict`
serves it in the frames' own pixels. (test_detection_runs.py: resume, two processes, the queue, tune.)"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import trainforge
from trainforge.cli import main
from trainforge.data import build_data
from trainforge.geometry import fit_image, to_file
from trainforge.metrics_file import read_metrics
from trainforge.training.artifacts import load_trained
from vision_data import write_shapes

# a Faster R-CNN on a ResNet-18 FPN, anchors for 64-pixel images, fewer proposals than COCO's (three shapes an image)
SMALL = ("model.args={arch: fasterrcnn_resnet50_fpn, backbone: resnet18, pretrained: false, "
         "anchor_sizes: [8, 16, 32, 64, 128], options: {rpn_pre_nms_top_n_train: 300, rpn_post_nms_top_n_train: 100, "
         "rpn_pre_nms_top_n_test: 300, rpn_post_nms_top_n_test: 50, box_batch_size_per_image: 32}}")
# RetinaNet on the same backbone: no sampling of anchors or proposals, each image's loss averaged over the batch
RETINA = ("model.args={arch: retinanet_resnet50_fpn, backbone: resnet18, pretrained: false, "
          "anchor_sizes: [8, 16, 32, 64, 128]}")
TRAIN = ["optim.name=adamw", "optim.lr=0.002", "optim.weight_decay=0", "schedule={name: cosine, warmup_steps: 5}",
         "data.augment={}", "train.early_stopping=null", "log.progress=false", "log.tensorboard=false"]


def overrides(root: Path, fmt: str, *extra: str, model: str = SMALL) -> list[str]:
    return [f"data.source={fmt}", f"data.path={root / fmt}", "data.args.image_size=64", model, *TRAIN, *extra]


@pytest.mark.parametrize("fmt", ["yolo", "voc"])
def test_yolo_and_voc_folders_give_the_detector_exactly_cocos_samples(fmt, wide_shapes):
    """The same shapes written as YOLO and VOC folders build the very samples the COCO folder builds (every image
    tensor, box and label equal, in every split, with the detection runs' overrides): a run on either is the COCO run
    of test_a_small_detector_learns_the_shapes, step for step (the loop is deterministic on the CPU), so that run's
    learning, report and eval stand for all three formats (issue 51: one detector trained instead of three)."""
    def bundle(name: str):
        cfg = trainforge.load_config("coco_detection_finetune", overrides(wide_shapes[0], name, *WIDE_RUN))
        return build_data(cfg.data, seed=cfg.seed)

    coco, other = bundle("coco"), bundle(fmt)
    assert other.info == coco.info
    for split in ("train", "val", "test"):
        a, b = getattr(coco, split), getattr(other, split)
        assert len(a) == len(b) > 0, split
        for i in range(len(a)):
            (image_a, target_a), (image_b, target_b) = a[i], b[i]
            assert torch.equal(image_a, image_b), (split, i)
            assert torch.equal(target_a["labels"], target_b["labels"]), (split, i)
            assert torch.equal(target_a["boxes"], target_b["boxes"]), (split, i)


@pytest.mark.slow
def test_a_small_detector_learns_the_shapes(keep_aspect_run, wide_shapes, tmp_path, capsys):
    run, ev = keep_aspect_run
    assert ev["map_50"] >= 0.5, ev  # untrained, it is 0: 80 steps of 8 frames find the boxes and tell their shape
    assert set(ev["per_class"]) == {"box", "disc"} and "loss" not in ev
    ran = json.loads((run / "final" / "model.json").read_text())["ran"]
    assert ran["micro_batch_size"] == 8 and "not simulated" in ran["reasons"]["micro_batch_size"]
    val = [r for r in read_metrics(run / "metrics.jsonl") if r["split"] == "val"]
    assert [r["step"] for r in val] == [40, 80] and all("map" in r and "loss" not in r for r in val)
    report = (run / "report.html").read_text()
    assert "map_50" in report and 'alt="Validation map, map_50, map_75, mar_100"' in report  # mAP over training
    assert 'alt="Precision-recall per class' in report and 'alt="The first validation images at step 80' in report
    assert set(ev["pr_curves"]["precision"]) == {"box", "disc"} and all("pr_curves" not in r for r in val)
    with pytest.raises(SystemExit) as code:  # the command line's eval gives the run's numbers again
        main(["eval", str(run), "--json"])
    assert code.value.code in (0, None)
    again = json.loads(capsys.readouterr().out)
    assert {k: again[k] for k in ("map", "map_50", "map_75")} == {k: ev[k] for k in ("map", "map_50", "map_75")}
    check_compressed_and_served(run, ev, wide_shapes, tmp_path, capsys)


WIDE = {"side": 64, "width": 192}  # 3:1 frames (KITTI's camera is 3.3:1): a 96x32 input under keep_aspect
WIDE_RUN = ("data.args.image_size=96", "train.max_steps=80", "train.eval_every_steps=40", "train.global_batch_size=8")


@pytest.fixture(scope="module")
def wide_shapes(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("wide")
    truth = write_shapes(root, n=160, seed=5, sizes=(4, 2), **WIDE)  # 16 to 32 pixels a side: 8 to 16 in the input
    return root, {file: (boxes, names) for file, boxes, names in truth}


@pytest.fixture(scope="module")
def keep_aspect_run(wide_shapes, module_tmp_path) -> tuple[Path, dict]:
    """The one detector trained here (data.args.resize keep_aspect, the default): its run and eval.json."""
    run = module_tmp_path / "keep-aspect"
    cfg = trainforge.load_config("coco_detection_finetune", overrides(
        wide_shapes[0], "coco", *WIDE_RUN, "train.micro_batch_size=auto", "log.report=true"))
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    return run, json.loads((run / "eval.json").read_text())


def iou(a: list[float], b: list[float]) -> float:
    w, h = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0) * max(h, 0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.slow
def test_keep_aspect_detects_wide_frames_at_least_as_well_as_stretch(keep_aspect_run, wide_shapes, tmp_path):
    """Issue 55: on 192x64 frames, keep_aspect (a 96x32 input) reaches at least stretch's map_50 (a 96x96 input in
    which every object is three times taller than wide as it was) on the same data and seed."""
    run, ev = keep_aspect_run
    assert json.loads((run / "data_report.json").read_text())["resize"] == "keep_aspect"
    cfg = trainforge.load_config("coco_detection_finetune", overrides(
        wide_shapes[0], "coco", *WIDE_RUN, "train.micro_batch_size=8", "data.args.resize=stretch", "log.report=false"))
    assert trainforge.train(cfg, run_dir=tmp_path / "stretch").status == "completed"
    stretched = json.loads((tmp_path / "stretch" / "eval.json").read_text())
    assert json.loads((tmp_path / "stretch" / "data_report.json").read_text())["resize"] == "stretch"
    assert ev["map_50"] >= stretched["map_50"], (ev["map_50"], stretched["map_50"])


def check_compressed_and_served(run: Path, ev: dict, data: tuple[Path, dict], tmp_path: Path, capsys) -> None:
    """compress: fp32 and int8 ONNX, scored by COCO's mAP on the test split; onnxruntime's fp32 detections are
    PyTorch's (same count, same classes, boxes within 1 px) on frames of their own aspect (the graph's H and W are
    dynamic); predict on image files: boxes in the files' pixels as JSON, drawn at the files' size."""
    with pytest.raises(SystemExit) as code:
        main(["compress", str(run), "--bench-seconds", "0.2", "--calibration-samples", "8", "--json"])
    assert code.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    rows = {v["name"]: v for v in doc["variants"]}
    assert rows["fp32"]["map_50"] == pytest.approx(ev["map_50"], abs=1e-3)
    assert rows["fp32"]["max_abs_diff"] < 1e-3
    assert abs(rows["int8"]["map_50"] - rows["fp32"]["map_50"]) < 0.05
    assert doc["recommendation"]["points"] == "map_50"

    import onnxruntime as ort

    trained = load_trained(run / "final")
    model = trained.build_model().eval()
    bundle = build_data(trained.config.data, seed=trained.config.seed, stored=trained.preprocess)
    session = ort.InferenceSession(str(run / "compressed" / "fp32.onnx"), providers=["CPUExecutionProvider"])
    found = 0
    for i in range(len(bundle.test)):
        image = bundle.test[i][0]
        with torch.no_grad():
            (want,) = model([image])
        boxes, scores, labels = session.run(["boxes", "scores", "labels"], {"input": image[None].numpy()})
        assert labels.tolist() == want["labels"].tolist(), i
        assert np.abs(boxes - want["boxes"].numpy()).max(initial=0) <= 1.0, i
        assert np.abs(scores - want["scores"].numpy()).max(initial=0) < 1e-3, i
        found += len(labels)
    assert found >= len(bundle.test)  # the trained detector finds something in every image, or near it

    root, truth = data  # predict on test frames: answers in the files' pixels (issue 55)
    names = [bundle.test.samples.ids[int(i)] for i in bundle.test.indices]
    files = [str(root / "coco" / "images" / name) for name in names]
    with pytest.raises(SystemExit) as code:
        main(["predict", str(run / "compressed"), *files, "--variant", "fp32", "--images", str(tmp_path / "drawn"),
              "--json"])
    assert code.value.code in (0, None)
    predicted = json.loads(capsys.readouterr().out)["predictions"]
    assert [p["input"] for p in predicted] == files
    width, height = WIDE["width"], WIDE["side"]
    best_iou = []
    for name, p in zip(names, predicted):
        assert (p["width"], p["height"]) == (width, height)
        assert p["detections"] and {d["label"] for d in p["detections"]} <= {"box", "disc"}
        scores = [d["score"] for d in p["detections"]]
        assert scores == sorted(scores, reverse=True)
        for d in p["detections"]:
            x1, y1, x2, y2 = d["box"]
            assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height
            assert d["box_relative"] == pytest.approx([x1 / width, y1 / height, x2 / width, y2 / height], abs=1e-4)
        # the model's own boxes moved to the file exactly: PyTorch's on the 96x32 input, scaled by the fit
        image = bundle.test[names.index(name)][0]
        with torch.no_grad():
            (want,) = model([image])
        fit = fit_image(width, height, trained.info.input_shape[-1], "keep_aspect")
        got = np.asarray([d["box"] for d in p["detections"]], dtype=np.float32).reshape(-1, 4)
        assert np.abs(got - to_file(want["boxes"].numpy(), fit)).max(initial=0) <= 2.0 + 0.01  # 1 px of the input
        best = p["detections"][0]  # over an annotated box in the file's pixels (in the input's, IoU would be ~0.25)
        best_iou.append(max(iou(best["box"], list(b)) for b in truth[name][0]))
        assert sum(p["objects"].values()) == sum(d["score"] >= 0.5 for d in p["detections"])
        assert Path(p["image"]).name == Path(name).with_suffix(".png").name  # named after the frame, at its size
        assert np.asarray(Image.open(p["image"])).shape == (height, width, 3)
    assert float(np.median(best_iou)) >= 0.7, best_iou  # a 96x32 input: a pixel off there is two in the file
