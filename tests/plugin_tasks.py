"""Test-only tasks (issue 41, point 6), not shipped: importing this module registers them, and a run imports it
through its `data.target` and `model.target` (tests put this folder on PYTHONPATH for the runs they start).

    fusion: a class from two inputs of different modalities, an 8x8 image and a feature vector, fused late by a
            tiny model (an encoder per input, one head), as issue 29's fusion models are.
    detection: boxes and labels, one to three per image (a list of dicts, one per image, as torchvision's detection
            targets are), and a model that returns its loss dict in training mode and its detections in eval mode,
            as torchvision's detectors do (issue 28).

Each task's data has a known answer, so a test can tell learning from noise.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainforge.data.base import DataBundle, DataInfo, InputInfo
from trainforge.models.base import InputSpec, NamedInputs
from trainforge.tasks import TASKS, Evaluation, Task, register_task
from trainforge.tasks.classification import Classification

FEATURES = 6
IMAGE = (1, 8, 8)


class Fusion(Classification):
    """Classification whose sample is {"image": (1, 8, 8), "features": (6,)}: the core batches, moves, plans and
    evaluates it through the task alone (torch's default collate batches a dict of tensors)."""

    name = "fusion"
    title = "image and feature fusion"
    description = "a class from an image and a feature vector, fused (test only)"


if "fusion" not in TASKS:
    register_task(Fusion)


class FusionSamples(Dataset):
    """Label = 8 * the image's mean + features[0] > 0 (two standard normals): either input alone is right about 3
    times in 4, both together always."""

    def __init__(self, num_samples: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn((num_samples, *IMAGE), generator=g)
        self.features = torch.randn((num_samples, FEATURES), generator=g)
        self.labels = (8 * self.images.mean(dim=(1, 2, 3)) + self.features[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, key: Any) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        index = key[1] if isinstance(key, tuple) else key  # the train split is read by (epoch, index)
        return {"image": self.images[index], "features": self.features[index]}, self.labels[index]


def fusion_data(num_samples: int = 512, seed: int = 0) -> DataBundle:
    info = DataInfo("fusion", "image", IMAGE, "float32", 2, ("low", "high"),
                    inputs=(InputInfo("image", IMAGE, "float32", "image"),
                            InputInfo("features", (FEATURES,), "float32", "tabular")))
    return DataBundle(info, FusionSamples(num_samples, seed), FusionSamples(64, seed + 1), FusionSamples(64, seed + 2),
                      report={"source": "fusion test data"})


class FusionNet(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.Flatten(),
                                   nn.Linear(width * 64, width))
        self.features = nn.Sequential(nn.Linear(FEATURES, width), nn.ReLU())
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(2 * width, 2))

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(torch.cat([self.image(inputs["image"]), self.features(inputs["features"])], dim=1))


def fusion_model(info: DataInfo, width: int = 16) -> tuple[nn.Module, NamedInputs]:
    """The model, and its example inputs built from what the data says of each named input."""
    shapes = {i.name: i.shape for i in info.named_inputs()}
    return FusionNet(width), NamedInputs(tuple((name, InputSpec(shape, torch.float32)) for name, shape in shapes.items()))


# ---------------------------------------------------------------- detection

SIDE = 32  # image side, pixels
SLOTS = 3  # at most this many boxes an image; the model predicts one (box, class) per slot
BOX_CLASSES = ("none", "dim", "bright")  # 0: no object in the slot


class Detection(Task):
    """A sample is (image (1, 32, 32), {"boxes": (n, 4) x1 y1 x2 y2 in pixels, "labels": (n,)}) with n of 1..3; a batch
    is (images stacked, a list of n target dicts). Recall and precision at IoU 0.5 (torchvision.ops.box_iou)."""

    name = "detection"
    title = "object detection"
    description = "boxes and labels, a different number per image (test only)"
    metrics = ("recall_50", "precision_50")
    default_metric = "recall_50"
    higher_is_better = frozenset(metrics)

    def collate(self, samples: list) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        return torch.stack([image for image, _ in samples]), [target for _, target in samples]

    def forward(self, model: nn.Module, batch: Any) -> Any:
        images, targets = batch
        return model(images, targets) if model.training else model(images)

    def training_loss(self, output: dict[str, torch.Tensor], batch: Any, *, label_smoothing: float = 0.0):
        return sum(loss.float() for loss in output.values())

    def evaluation(self, info: Any) -> Evaluation:
        return DetectionEvaluation(self)

    def example_batch(self, info: Any, inputs: torch.Tensor, batch_size: int) -> Any:
        box = torch.tensor([[4.0, 4.0, 12.0, 12.0], [16.0, 16.0, 28.0, 28.0]], device=inputs.device)
        return inputs, [{"boxes": box, "labels": torch.tensor([1, 2], device=inputs.device)}] * batch_size


class DetectionEvaluation(Evaluation):
    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.matched = self.targets = self.predicted = 0

    def add_batch(self, output: list[dict[str, torch.Tensor]], batch: Any) -> None:
        from torchvision.ops import box_iou

        for found, want in zip(output, batch[1]):
            self.count += 1
            self.targets += len(want["labels"])
            self.predicted += len(found["labels"])
            if len(found["labels"]) and len(want["labels"]):
                hit = (box_iou(want["boxes"], found["boxes"]) >= 0.5) & (want["labels"][:, None] == found["labels"])
                self.matched += int(hit.any(dim=1).sum())

    @property
    def mean_loss(self) -> Optional[float]:
        return None  # in eval mode the model gives detections, not losses

    def result(self, detailed: bool) -> dict[str, Any]:
        return {"recall_50": self.matched / max(self.targets, 1),
                "precision_50": self.matched / self.predicted if self.predicted else 0.0}


if "detection" not in TASKS:
    register_task(Detection)


class BoxSamples(Dataset):
    """Images of 1..3 non-overlapping squares on noise, each dim (label 1) or bright (label 2), left to right."""

    def __init__(self, num_samples: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(num_samples):
            image = 0.1 * torch.randn((1, SIDE, SIDE), generator=g)
            n = int(torch.randint(1, SLOTS + 1, (), generator=g))
            boxes, labels = [], []
            for k in range(n):  # slot k: a column band of the image, so boxes never overlap
                size = int(torch.randint(6, 10, (), generator=g))
                x1 = k * 10 + int(torch.randint(0, 10 - size + 1, (), generator=g)) if size < 10 else k * 10
                y1 = int(torch.randint(0, SIDE - size, (), generator=g))
                label = int(torch.randint(1, 3, (), generator=g))
                image[0, y1:y1 + size, x1:x1 + size] += 0.5 * label
                boxes.append([x1, y1, x1 + size, y1 + size])
                labels.append(label)
            self.items.append((image, {"boxes": torch.tensor(boxes, dtype=torch.float32),
                                       "labels": torch.tensor(labels, dtype=torch.long)}))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self.items[key[1] if isinstance(key, tuple) else key]


def detection_data(num_samples: int = 256, seed: int = 0) -> DataBundle:
    info = DataInfo("detection", "image", (1, SIDE, SIDE), "float32", len(BOX_CLASSES), BOX_CLASSES)
    return DataBundle(info, BoxSamples(num_samples, seed), BoxSamples(32, seed + 1), BoxSamples(32, seed + 2),
                      report={"source": "detection test data"})


class SlotDetector(nn.Module):
    """One (box, class) prediction per slot. Training mode: model(images, targets) -> {"loss_classifier",
    "loss_box_reg"}, each a mean over the images (so two half-batches average to the whole); eval mode:
    model(images) -> [{"boxes", "labels", "scores"}] per image, the slots predicted to hold an object."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, width, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                                      nn.Linear(width * 64, 64), nn.ReLU())
        self.classes = nn.Linear(64, SLOTS * len(BOX_CLASSES))
        self.boxes = nn.Linear(64, SLOTS * 4)

    def forward(self, images: torch.Tensor, targets: Optional[list[dict[str, torch.Tensor]]] = None) -> Any:
        features = self.backbone(images)
        logits = self.classes(features).view(-1, SLOTS, len(BOX_CLASSES))
        boxes = torch.sigmoid(self.boxes(features)).view(-1, SLOTS, 4) * SIDE
        if self.training:
            assert targets is not None, "in training mode the detector takes the targets and returns its losses"
            return self.losses(logits, boxes, targets)
        scores, labels = logits.float().softmax(-1).max(-1)
        return [{"boxes": b[lab > 0], "labels": lab[lab > 0], "scores": s[lab > 0]}
                for b, lab, s in zip(boxes, labels, scores)]

    @staticmethod
    def losses(logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict[str, torch.Tensor]]) -> dict:
        cls, reg = [], []
        for slot_logits, slot_boxes, target in zip(logits, boxes, targets):
            n = len(target["labels"])
            want = torch.zeros(SLOTS, dtype=torch.long, device=slot_logits.device)
            want[:n] = target["labels"]
            cls.append(F.cross_entropy(slot_logits.float(), want))
            reg.append(F.l1_loss(slot_boxes[:n].float(), target["boxes"]) / SIDE)
        return {"loss_classifier": torch.stack(cls).mean(), "loss_box_reg": torch.stack(reg).mean()}


def detection_model(info: DataInfo, width: int = 16) -> tuple[nn.Module, InputSpec]:
    return SlotDetector(width), InputSpec(tuple(info.input_shape), torch.float32)
