"""Evaluation: loss and task metrics of a model on a split.

    trainforge eval runs/digits_cnn-.../ --split test --json     # --no-verify: skip the SHA-256 check
    trainforge.evaluate("runs/digits_cnn-.../", split="test")
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from trainforge.data import build_data
from trainforge.data.base import DataInfo
from trainforge.data.stages.loader import make_eval_loader
from trainforge.errors import UserError
from trainforge.hardware.device import resolve_device, supports_bf16
from trainforge.training.artifacts import load_trained
from trainforge.tasks import task_of
from trainforge.tasks.batch import to_device
from trainforge.engine.precision import autocast, resolve_precision

SPLITS = ("train", "val", "test")
@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    loader: DataLoader,
    *,
    info: DataInfo,
    device: torch.device,
    precision: str = "fp32",
    detailed: bool = True,
    picture: Optional[Path] = None,
) -> dict[str, Any]:
    """Mean loss (no label smoothing) and the task's metrics; `detailed` adds the task's detail (classification:
    per-class report and confusion matrix). `picture`: where the task's picture of the pass goes (a PNG, replaced
    whole), for a task that draws one (a detector's boxes on the first images)."""
    was_training = model.training
    model.eval()
    task = task_of(info)
    evaluation = task.evaluation(info)
    for batch in loader:
        batch = to_device(batch, device)
        with autocast(device, precision):
            output = task.forward(model, batch)
        evaluation.add_batch(output, batch)
    model.train(was_training)
    if evaluation.count == 0:
        raise UserError("the evaluation split is empty; raise data.val_fraction / data.test_fraction")
    if picture is not None:
        drawn = evaluation.picture()
        if drawn is not None:
            save_png(drawn, picture)
    loss = evaluation.mean_loss
    return {**({"loss": loss} if loss is not None else {}), "num_samples": len(loader.dataset),
            **evaluation.result(detailed)}


def save_png(picture: Any, path: Path) -> None:
    """An (H, W, 3) uint8 array as a PNG at `path`, written beside it and renamed into place (a reader never sees
    half a picture)."""
    from PIL import Image

    tmp = path.with_name(f".{path.name}.tmp")
    Image.fromarray(picture, mode="RGB").save(tmp, format="PNG")
    tmp.replace(path)


def evaluate_checkpoint(path: str | Path, split: str = "test", device: Optional[str] = None, *,
                        verify: bool = True) -> dict[str, Any]:
    """Evaluate a run dir / final/ / checkpoints/step-* on a split of the data it was trained on.

    `verify=False` (--no-verify) skips the SHA-256 check of the files against their manifest.
    """
    if split not in SPLITS:
        raise UserError(f"--split: expected one of {', '.join(SPLITS)}, got {split!r}")
    trained = load_trained(path, verify=verify)
    cfg = trained.config
    dev = resolve_device(device or cfg.train.device)
    data = build_data(cfg.data, seed=cfg.seed, stored=trained.preprocess)  # the run's own tokenizer
    dataset = {"train": _plain_train(data), "val": data.val, "test": data.test}[split]
    model = trained.build_model().to(dev)
    batch = cfg.train.micro_batch_size if isinstance(cfg.train.micro_batch_size, int) else 256
    loader = make_eval_loader(dataset, batch_size=batch, num_workers=0, pin_memory=dev.type == "cuda",
                              collate=task_of(trained.info).collator(trained.info, train=False))
    result = evaluate_model(model, loader, info=trained.info, device=dev, precision=resolve_precision(cfg.train.precision, dev.type, supports_bf16(dev))[0])
    return {"split": split, "step": trained.step, "checkpoint": str(trained.source), "task": trained.info.task,
            **result}


def _plain_train(data) -> Any:
    """The train split without augmentation, for `--split train`."""
    return getattr(data, "train_eval", None) or data.train

