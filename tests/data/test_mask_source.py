"""The `masks` source and the segmentation metrics (issue 28): label maps read as written (grey or palette PNGs);
every cleaning reason counted; a mask value beyond the class list is one line; augmentation moves the mask with the
pixels; mIoU, Dice and pixel accuracy equal a direct confusion-matrix computation."""
from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from trainforge.config import load_config
from trainforge.data import build_data
from trainforge.data.summary import summarize
from trainforge.errors import UserError
from trainforge.tasks import task_of
from vision_data import MASK_CLASSES, write_masks

CLASSES = "[" + ", ".join(MASK_CLASSES) + "]"


def data_cfg(path, *extra: str):
    return load_config("segmentation_finetune", [f"data.path={path}", f"data.args.classes={CLASSES}",
                                                 "data.args.image_size=64", *extra]).data


@pytest.mark.parametrize("palette", [False, True])
def test_masks_are_read_as_written(tmp_path, palette):
    masks = write_masks(tmp_path, n=10, side=64, seed=1, palette=palette)
    bundle = build_data(data_cfg(tmp_path, "data.val_fraction=0", "data.test_fraction=0", "data.augment={}"), seed=0)
    assert bundle.info.task == "segmentation" and bundle.info.class_names == MASK_CLASSES
    for k, index in enumerate(bundle.train.indices):
        x, y = bundle.train[k]
        assert x.shape == (3, 64, 64) and y.dtype == torch.int64
        assert np.array_equal(y.numpy(), masks[int(bundle.train.samples.ids[index][4:8])])
    counts = np.bincount(np.concatenate([m.reshape(-1) for m in masks]), minlength=3)
    assert bundle.report["pixels_per_class"] == dict(zip(MASK_CLASSES, counts.tolist()))


def planted(tmp_path):
    write_masks(tmp_path, n=6, side=64, seed=2)
    (tmp_path / "images" / "corrupt.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    shutil.copy(tmp_path / "masks" / "img_0000.png", tmp_path / "masks" / "corrupt.png")
    shutil.copy(tmp_path / "images" / "img_0000.jpg", tmp_path / "images" / "no_mask.jpg")  # and no masks/no_mask.png
    shutil.copy(tmp_path / "images" / "img_0000.jpg", tmp_path / "images" / "copy.jpg")
    shutil.copy(tmp_path / "masks" / "img_0000.png", tmp_path / "masks" / "copy.png")
    Image.fromarray(np.full((48, 64, 3), 9, np.uint8)).save(tmp_path / "images" / "short.jpg")
    shutil.copy(tmp_path / "masks" / "img_0001.png", tmp_path / "masks" / "short.png")  # 64 x 64 for a 64 x 48
    return tmp_path


def test_every_cleaning_reason_is_counted_exactly(tmp_path):
    report = build_data(data_cfg(planted(tmp_path)), seed=0).report
    assert report["dropped"] == {"corrupt": 1, "missing_mask": 1, "size_mismatch": 1, "duplicate": 1}
    assert report["rows_read"] == 10 and report["rows_kept"] == 6
    assert report["dropped_examples"]["size_mismatch"] == ["short.jpg"]
    line = summarize(report).line
    assert "10 rows read, 6 kept, dropped 4 (corrupt 1, missing_mask 1, size_mismatch 1, duplicate 1)" in line


def test_a_mask_value_beyond_the_classes_is_one_line_exit_2(tmp_path):
    write_masks(tmp_path, n=4, side=32, seed=3)
    mask = np.asarray(Image.open(tmp_path / "masks" / "img_0002.png")).copy()
    mask[:2, :2] = 7
    Image.fromarray(mask).save(tmp_path / "masks" / "img_0002.png")
    with pytest.raises(UserError, match=r"img_0002.png: values 7 are no class of the 3 in data.args.classes"):
        build_data(data_cfg(tmp_path), seed=0)
    out = subprocess.run([sys.executable, "-m", "trainforge", "train", "segmentation_finetune", f"data.path={tmp_path}",
                          f"data.args.classes={CLASSES}", "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "values 7 are no class" in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


def test_augmentation_moves_the_mask_with_the_pixels(tmp_path):
    write_masks(tmp_path, n=8, side=64, seed=4)
    plain = build_data(data_cfg(tmp_path, "data.augment={}"), seed=0)
    flipped = build_data(data_cfg(tmp_path, "data.augment={hflip: 1.0}"), seed=0)
    for index in range(len(plain.train)):
        x, y = plain.train[index]
        fx, fy = flipped.train[(0, index)]
        assert torch.equal(fx, x.flip(-1)) and torch.equal(fy, y.flip(-1))
    rotated = build_data(data_cfg(tmp_path, "data.augment={rotation_deg: 30}"), seed=0)
    _, y = rotated.train[(0, 0)]
    assert set(y.unique().tolist()) <= {0, 1, 2, 255} and (y == 255).any()  # corners brought into view: unlabelled


def test_miou_dice_and_pixel_accuracy_equal_a_direct_confusion_matrix():
    from sklearn.metrics import confusion_matrix

    from trainforge.data.base import DataInfo

    g = torch.Generator().manual_seed(0)
    info = DataInfo("segmentation", "image", (3, 16, 16), "float32", 4, ("a", "b", "c", "d"))
    task = task_of(info)
    evaluation = task.evaluation(info)
    truth, guesses = [], []
    for _ in range(3):
        target = torch.randint(0, 3, (5, 16, 16), generator=g)  # class d never occurs
        target[:, 0] = 255  # an unlabelled row
        logits = torch.randn(5, 4, 16, 16, generator=g)
        logits[:, :3] += 3 * torch.nn.functional.one_hot(target.clamp(max=2), 3).permute(0, 3, 1, 2)
        evaluation.add(logits, target)
        keep = target != 255
        truth.append(target[keep].numpy())
        guesses.append(logits.argmax(1)[keep].numpy())
    got = evaluation.result(detailed=True)
    cm = confusion_matrix(np.concatenate(truth), np.concatenate(guesses), labels=[0, 1, 2, 3]).astype(float)
    tp, fp, fn = np.diag(cm), cm.sum(0) - np.diag(cm), cm.sum(1) - np.diag(cm)
    present = (tp + fp + fn) > 0
    iou = tp[present] / (tp + fp + fn)[present]
    assert got["miou"] == pytest.approx(iou.mean(), abs=1e-12)
    assert got["dice"] == pytest.approx((2 * tp / (2 * tp + fp + fn))[present].mean(), abs=1e-12)
    assert got["pixel_accuracy"] == pytest.approx(tp.sum() / cm.sum(), abs=1e-12)
    assert 0.3 < got["miou"] < 0.95
    assert [got["per_class"][n]["iou"] for n in "abc"] == pytest.approx(iou[:3].tolist(), abs=1e-12)
    # d is predicted here and there but never true: IoU 0, and counted in the mean (a class the model invents)
    assert present[3] and cm[3].sum() == 0 and got["per_class"]["d"]["iou"] == 0.0
