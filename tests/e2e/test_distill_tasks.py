"""Distillation belongs to the task (issue 51, item 2): `compress --prune --distill` on a segmentation run trains the
pruned segmenter from its teacher pixel by pixel (tests/compression/test_compress_parts.py checks the KL term
against a direct per-pixel computation); on a detection run it is one line and exit 2, before anything is pruned."""
from __future__ import annotations

import json

import pytest

from trainforge.cli import main
from vision_data import MASK_CLASSES, write_masks, write_shapes

QUICK = ["train.max_steps=2", "train.global_batch_size=4", "train.micro_batch_size=4", "train.eval_every_steps=2",
         "train.early_stopping=null", "schedule.warmup_steps=0", "data.num_workers=0", "train.device=cpu",
         "log.progress=false", "log.tensorboard=false", "log.report=false"]


def train(args: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as code:
        main(["train", *args, *QUICK])
    assert code.value.code in (0, None), capsys.readouterr().err[-3000:]


@pytest.mark.slow
def test_compress_distils_a_pruned_segmenter_from_its_teacher(tmp_path, capsys):
    write_masks(tmp_path / "data", n=24, side=32, seed=0)
    train(["segmentation_finetune", f"data.path={tmp_path / 'data'}", f"data.args.classes=[{', '.join(MASK_CLASSES)}]",
           "data.args.image_size=32", "model.args={arch: lraspp_mobilenet_v3_large, pretrained: false}",
           "--run-dir", str(tmp_path / "run")], capsys)
    capsys.readouterr()
    with pytest.raises(SystemExit) as code:
        main(["compress", str(tmp_path / "run"), "--prune", "0.25", "--finetune-epochs", "1", "--distill",
              "--bench-seconds", "0.1", "--calibration-samples", "8", "--json"])
    out = capsys.readouterr()
    assert code.value.code in (0, None), out.err[-3000:]
    doc = json.loads(out.out)
    assert doc.get("finetune"), (doc.get("pruning"), out.err[-2000:])
    assert doc["finetune"]["distill"] is True and doc["finetune"]["status"] == "completed", doc.get("finetune")
    assert "pruned" in {v["name"] for v in doc["variants"]}


def test_compress_refuses_to_distil_a_detector_in_one_line(tmp_path, capsys):
    write_shapes(tmp_path, n=12, side=64, seed=0, formats=("coco",))
    small = ("model.args={arch: fasterrcnn_resnet50_fpn, backbone: resnet18, pretrained: false, anchor_sizes: "
             "[8, 16, 32, 64, 128], options: {rpn_pre_nms_top_n_train: 50, rpn_post_nms_top_n_train: 20, "
             "rpn_pre_nms_top_n_test: 50, rpn_post_nms_top_n_test: 10, box_batch_size_per_image: 8}}")
    train(["coco_detection_finetune", f"data.path={tmp_path / 'coco'}", "data.args.image_size=64", small,
           "data.augment={}", "train.global_batch_size=2", "train.micro_batch_size=2", "--run-dir",
           str(tmp_path / "run")], capsys)
    capsys.readouterr()
    with pytest.raises(SystemExit) as code:
        main(["compress", str(tmp_path / "run"), "--prune", "0.25", "--finetune-epochs", "1", "--distill"])
    err = capsys.readouterr().err.strip()
    assert code.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err[-3000:]
    assert "--distill: detection defines no distillation" in err, err
    assert not (tmp_path / "run" / "compressed").exists()
