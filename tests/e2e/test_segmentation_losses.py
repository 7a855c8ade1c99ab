"""train.loss for a segmenter: cross-entropy (the default), or MONAI's Dice, Dice + cross-entropy and focal, each
leaving the unlabelled pixels out; a run trains with the named loss; a loss the task does not have is one line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import trainforge
from trainforge.metrics_file import read_metrics
from trainforge.tasks import TASKS
from vision_data import MASK_CLASSES, write_masks

SEG = TASKS.get("segmentation")
CLASSES = "[" + ", ".join(MASK_CLASSES) + "]"


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 16, 16, generator=g, requires_grad=True)
    target = torch.randint(0, 3, (2, 16, 16), generator=g)
    target[:, :3] = 255  # unlabelled rows
    return logits, (torch.zeros(2, 3, 16, 16), target)


@pytest.mark.parametrize("name", ["cross_entropy", "dice", "dice_ce", "focal"])
def test_each_loss_leaves_unlabelled_pixels_out_and_trains(name):
    logits, b = batch()
    value = SEG.training_loss(logits, b, loss=name)
    assert value.dim() == 0 and torch.isfinite(value) and value > 0
    other = logits.detach().clone()
    other[:, :, :3] = 50 * torch.randn(2, 3, 3, 16)  # anything at the unlabelled pixels
    assert SEG.training_loss(other, b, loss=name).item() == pytest.approx(value.item(), rel=1e-6)
    value.backward()
    assert logits.grad[:, :, :3].abs().max() == 0 and logits.grad[:, :, 3:].abs().max() > 0


def test_the_losses_are_monais_and_torchs_own():
    from monai.losses import DiceLoss

    logits, b = batch(1)
    target = b[1]
    labelled = target != 255
    # cross-entropy: the mean over the labelled pixels
    per_pixel = F.cross_entropy(logits, target.clamp(max=2), reduction="none")
    assert SEG.training_loss(logits, b).item() == pytest.approx(per_pixel[labelled].mean().item(), rel=1e-6)
    # Dice over the labelled pixels only: MONAI's own DiceLoss on them, one-hot and softmax as configured
    probs = torch.softmax(logits, 1)
    onehot = F.one_hot(target.clamp(max=2), 3).permute(0, 3, 1, 2).float() * labelled[:, None]
    direct = DiceLoss(include_background=True, batch=True)(probs * labelled[:, None], onehot)
    assert SEG.training_loss(logits, b, loss="dice").item() == pytest.approx(direct.item(), rel=1e-5)
    assert SEG.training_loss(logits, b, loss="dice_ce").item() == pytest.approx(
        direct.item() + SEG.training_loss(logits, b).item(), rel=1e-5)


@pytest.mark.slow
def test_a_run_trains_with_the_named_loss_and_a_wrong_name_is_one_line(tmp_path):
    write_masks(tmp_path / "data", n=40, side=32, seed=2)
    args = [f"data.path={tmp_path / 'data'}", f"data.args.classes={CLASSES}", "data.args.image_size=32",
            "model.args={arch: lraspp_mobilenet_v3_large, pretrained: false}", "train.max_steps=6",
            "train.eval_every_steps=6", "train.global_batch_size=4", "train.micro_batch_size=4",
            "train.log_every_steps=1", "train.early_stopping=null", "log.progress=false", "log.tensorboard=false",
            "train.device=cpu"]
    runs = {}
    for name in ("cross_entropy", "dice"):
        run = tmp_path / name
        cfg = trainforge.load_config("segmentation_finetune", [*args, f"train.loss={name}"])
        assert trainforge.train(cfg, run_dir=run).status == "completed"
        runs[name] = [r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"]
        assert "miou" in json.loads((run / "eval.json").read_text())
    # the same model, data and order: only the loss differs, and a Dice loss is at most 1
    assert runs["cross_entropy"] != runs["dice"] and all(0 < v <= 1 for v in runs["dice"])
    out = subprocess.run([sys.executable, "-m", "trainforge", "train", "segmentation_finetune", *args,
                          "train.loss=lovasz", "--run-dir", str(tmp_path / "bad")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "train.loss: 'lovasz' is not a semantic segmentation loss; choose one of cross_entropy, dice, dice_ce, " \
           "focal" in out.stderr
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_a_task_of_one_loss_refuses_train_loss():
    from trainforge.errors import UserError

    with pytest.raises(UserError, match="train.loss: 'dice' is not a classification loss; this task has one"):
        TASKS.get("classification").check_loss("dice", "train.loss")
