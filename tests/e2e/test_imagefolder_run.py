"""An image folder with corrupt, unreadable and duplicate files trains, and the report counts each."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

import trainforge


def make_folder(root: Path) -> None:
    digits = load_digits()
    for i, (img, label) in enumerate(zip(digits.images[:300], digits.target[:300])):
        if label > 2:
            continue
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((img * 15).astype(np.uint8)).resize((16, 16)).save(folder / f"{i:04d}.png")
    good = next((root / "class_0").glob("*.png"))
    (root / "class_0" / "truncated.png").write_bytes(good.read_bytes()[:40])  # cut off mid-file
    (root / "class_1" / "notes.jpg").write_text("not an image at all")
    shutil.copy(good, root / "class_2" / "copy_of_a_zero.png")  # same bytes: a duplicate


def test_imagefolder_with_bad_files_trains_and_reports(tmp_path: Path):
    make_folder(tmp_path / "images")
    result = trainforge.train(None, overrides=[
        "name=folder", "data.source=imagefolder", f"data.path={tmp_path / 'images'}",
        "data.args={image_size: 16, grayscale: true}", "model.args={channels: [8, 16]}",
        "train.epochs=15", "schedule.warmup_steps=0", "train.global_batch_size=16", "train.micro_batch_size=16",
        "train.early_stopping=null", "log.progress=false", "log.tensorboard=false",
    ], run_dir=tmp_path / "run")
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["dropped"]["corrupt"] == 2
    assert report["dropped"]["duplicate"] == 1
    assert report["rows_kept"] == report["rows_read"] - 3
    assert sum(report["splits"].values()) == report["rows_kept"]
    assert result.eval["accuracy"] > 0.8  # three digit classes at 16x16
    assert "corrupt" in (tmp_path / "run" / "report.html").read_text()
