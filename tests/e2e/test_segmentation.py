"""Segmentation end to end (issue 28): torchvision's FCN learns the shapes' pixels from a masks folder, is compressed
to ONNX (fp32 and int8), whose masks agree with PyTorch's on the test split, and `trainforge predict` serves it on
image files: class shares as JSON, the mask drawn with --images. A segmenter's run SIGKILLed mid-epoch resumes
bit-identical, and two processes match one that accumulates the same two micro-batches."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import trainforge
from test_crash_resume import assert_killed_run_matches_uninterrupted, two_process_losses
from trainforge.cli import main
from trainforge.data import build_data
from trainforge.training.artifacts import load_trained
from vision_data import MASK_CLASSES, write_masks

CLASSES = "[" + ", ".join(MASK_CLASSES) + "]"


@pytest.mark.slow
def test_a_segmenter_learns_the_shapes_and_its_onnx_masks_agree_with_pytorch(tmp_path, capsys):
    write_masks(tmp_path / "data", n=160, side=48, seed=0)
    run = tmp_path / "run"
    cfg = trainforge.load_config("segmentation_finetune", [
        f"data.path={tmp_path / 'data'}", f"data.args.classes={CLASSES}", "data.args.image_size=48",
        "model.args={arch: fcn_resnet50, pretrained: false}", "optim.lr=0.001", "train.max_steps=60",
        "train.eval_every_steps=30", "train.global_batch_size=8", "train.micro_batch_size=auto",
        "data.augment={hflip: 0.5}", "train.early_stopping=null", "log.progress=false", "log.tensorboard=false"])
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    ev = json.loads((run / "eval.json").read_text())
    assert ev["miou"] > 0.6 and ev["dice"] > 0.7, ev  # untrained: everything background, mIoU about 0.3
    assert set(ev["per_class"]) == set(MASK_CLASSES) and ev["per_class"]["disc"]["iou"] > 0.3
    ran = json.loads((run / "final" / "model.json").read_text())["ran"]
    assert "predicted peak" in ran["reasons"]["micro_batch_size"]
    assert Image.open(run / "val_images.png").size == (3 * 192 + 8, 4 * 192 + 12)  # image, true, predicted; 4 rows  # the planner simulated the segmenter's step

    with pytest.raises(SystemExit) as code:
        main(["compress", str(run), "--bench-seconds", "0.2", "--calibration-samples", "16", "--json"])
    assert code.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    rows = {v["name"]: v for v in doc["variants"]}
    assert rows["fp32"]["miou"] == pytest.approx(ev["miou"], abs=1e-6)
    assert abs(rows["int8"]["miou"] - rows["fp32"]["miou"]) < 0.05

    # onnxruntime's masks against PyTorch's on the test split: the same class for at least 99% of the pixels
    import onnxruntime as ort

    trained = load_trained(run / "final")
    model = trained.build_model().eval()
    bundle = build_data(trained.config.data, seed=trained.config.seed, stored=trained.preprocess)
    images = torch.stack([bundle.test[i][0] for i in range(len(bundle.test))])
    with torch.no_grad():
        torch_masks = model(images).argmax(1).numpy()
    for variant in ("fp32", "int8"):
        session = ort.InferenceSession(str(run / "compressed" / f"{variant}.onnx"), providers=["CPUExecutionProvider"])
        (logits,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
        agree = float((logits.argmax(1) == torch_masks).mean())
        assert agree >= (0.99 if variant == "fp32" else 0.95), (variant, agree)

    # predict on image files: class shares, and the mask drawn beside the image
    files = [str(tmp_path / "data" / "images" / f"img_{i:04d}.jpg") for i in range(2)]
    with pytest.raises(SystemExit) as code:
        main(["predict", str(run / "compressed"), *files, "--variant", "fp32", "--images", str(tmp_path / "drawn"),
              "--json"])
    assert code.value.code in (0, None)
    predicted = json.loads(capsys.readouterr().out)["predictions"]
    assert [p["input"] for p in predicted] == files
    for p in predicted:
        assert set(p["classes"]) <= set(MASK_CLASSES) and sum(p["classes"].values()) == pytest.approx(1, abs=1e-3)
        drawn = np.asarray(Image.open(p["image"]))
        assert drawn.shape == (48, 96, 3)  # the tinted image and the mask, side by side
        assert Path(p["image"]).name == Path(p["input"]).with_suffix(".png").name

    # issue 55: a frame of another size is fitted as training fitted (keep_aspect, padded) and answered in its pixels
    wide = tmp_path / "wide.png"
    Image.open(files[0]).resize((120, 40)).save(wide)
    with pytest.raises(SystemExit) as code:
        main(["predict", str(run / "compressed"), str(wide), "--variant", "fp32", "--images", str(tmp_path / "wide"),
              "--json"])
    assert code.value.code in (0, None)
    (p,) = json.loads(capsys.readouterr().out)["predictions"]
    assert (p["height"], p["width"]) == (40, 120) and sum(p["classes"].values()) == pytest.approx(1, abs=1e-3)
    assert np.asarray(Image.open(p["image"])).shape == (40, 240, 3) and Path(p["image"]).name == "wide.png"


# LR-ASPP on MobileNetV3: the smallest of the segmenters, and without dropout (DeepLabV3's and FCN's heads have it,
# which two processes draw differently from one)
LRASPP = "model.args={arch: lraspp_mobilenet_v3_large, pretrained: false}"


def small_run(data, *extra: str) -> list[str]:
    return [f"data.path={data}", f"data.args.classes={CLASSES}", "data.args.image_size=48", LRASPP,
            "train.early_stopping=null", "log.progress=false", "log.tensorboard=false", "train.device=cpu",
            "train.log_every_steps=1", *extra]


@pytest.fixture(scope="module")
def masks(tmp_path_factory):
    root = tmp_path_factory.mktemp("masks")
    write_masks(root, n=96, side=48, seed=1)
    return root


@pytest.mark.slow
@pytest.mark.serial  # bit-identity is measured with the machine to itself: in the parallel phase it failed
def test_a_segmenter_run_sigkilled_mid_epoch_resumes_bit_identical(masks, tmp_path):
    """Augmented masks (flips, crops: a per-sample generator) and BatchNorm statistics: a resume restores both."""
    args = small_run(masks, "train.max_steps=30", "train.eval_every_steps=15", "train.checkpoint_every_steps=5",
                     "train.global_batch_size=4", "train.micro_batch_size=2",
                     "data.augment={hflip: 0.5, crop_scale: [0.6, 1.0]}")
    assert_killed_run_matches_uninterrupted("segmentation_finetune", args, tmp_path, steps=30)


@pytest.mark.slow
@pytest.mark.serial
def test_two_processes_on_a_segmenter_match_one_accumulating_the_same_micro_batches(masks, tmp_path):
    """2 processes x micro-batch 2 against 1 process x micro-batch 2, accumulated twice: the same global batch of 4
    and the same BatchNorm batches (BatchNorm normalizes each micro-batch by its own statistics, so one process at
    micro-batch 4 is a different model by definition; without BatchNorm it is the same, as the detector's test shows)."""
    common = small_run(masks, "train.max_steps=6", "train.eval_every_steps=6", "train.global_batch_size=4",
                       "train.micro_batch_size=2", "optim={name: sgd, lr: 0.01, momentum: 0.9}", "data.augment={}")
    losses = two_process_losses("segmentation_finetune", common, common, tmp_path)
    assert len(losses[0]) == len(losses[1]) == 6
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-5, losses
