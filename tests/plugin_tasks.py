"""Test-only tasks (issue 41, point 6), not shipped: importing this module registers them, and a run imports it
through its `data.target` and `model.target` (tests put this folder on PYTHONPATH for the runs they start).

    fusion: a class from two inputs of different modalities, an 8x8 image and a feature vector, fused late by a
            tiny model (an encoder per input, one head), as issue 29's fusion models are.
    detection: boxes and labels, one to three per image (a list of dicts, one per image, as torchvision's detection
            targets are), and a model that returns its loss dict in training mode and its detections in eval mode,
            as torchvision's detectors do (issue 28).
    waveform (a modality, issue 51 point 4): (2, 32) signals, channels first, classified by the frequency of channel
            0; channel 1 is noise around 100. The pipeline fits per-channel normalization through the modality's
            channel_view (-1, 1) and augments by its own time reversal (data.augment.hflip), naming no modality.
    volume: 5-D inputs (N, 1, D, H, W) with a class per voxel (issue 29's CT), trained on 8^3 patches and evaluated
            on 16^3 volumes by sliding-window inference over patches the size the model trained on.

Each task's data has a known answer, so a test can tell learning from noise. Each exports to ONNX and is served by
`trainforge predict --import plugin_tasks` from .npz files: fusion by its two named inputs (Classification's
predictions), detection as padded slots its predictions filter, volume as the patch model that predict slides over
the whole volume as evaluation does.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainforge.data.base import DataBundle, DataInfo, InputInfo
from trainforge.data.modalities import MODALITIES, Modality, register_modality
from trainforge.data.samples import Pool
from trainforge.data.pool import TensorSamples
from trainforge.models.base import InputSpec, NamedInputs
from trainforge.tasks import TASKS, Evaluation, Task, register_task
from trainforge.tasks.base import ExportSignature
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
BOX_COLOURS = {"dim": (0, 255, 0), "bright": (255, 0, 0)}


class Detection(Task):
    """A sample is (image (1, 32, 32), {"boxes": (n, 4) x1 y1 x2 y2 in pixels, "labels": (n,)}) with n of 1..3; a batch
    is (images stacked, a list of n target dicts). Recall and precision at IoU 0.5 (torchvision.ops.box_iou)."""

    name = "slot_detection"
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

    # export: every slot, padded (label 0: no object), so the graph's outputs have fixed shapes; the detections
    # are the slots that hold an object, filtered after inference exactly as the model filters them in eval mode
    def export_signature(self, info: Any) -> ExportSignature:
        return ExportSignature.batched(["input"], ["boxes", "scores", "labels"])

    def export_module(self, model: nn.Module, info: Any) -> nn.Module:
        return SlotOutputs(model)

    def score_outputs(self, outputs: dict, batch: Any, info: Any) -> dict:
        evaluation = self.evaluation(info)
        evaluation.add_batch(detections(*(torch.from_numpy(outputs[k]) for k in ("boxes", "scores", "labels"))), batch)
        return evaluation.result(False)

    quality = ("recall_50", "R@.5", "test recall at IoU 0.5")
    prediction_columns = ("labels", "scores", "boxes")

    def prediction_image(self, sample: dict, output: dict, prediction: dict, meta: dict) -> np.ndarray:
        """The image, 8 times larger, with each detected box drawn in its class's colour (dim: green, bright: red)."""
        from PIL import Image, ImageDraw

        image = sample["input"][0]
        grey = np.uint8(255 * (image - image.min()) / max(float(np.ptp(image)), 1e-6))
        picture = Image.fromarray(grey, mode="L").convert("RGB").resize((SIDE * 8, SIDE * 8), Image.NEAREST)
        draw = ImageDraw.Draw(picture)
        for (x1, y1, x2, y2), label in zip(prediction["boxes"], prediction["labels"]):  # corners in any order
            draw.rectangle([8 * min(x1, x2), 8 * min(y1, y2), 8 * max(x1, x2), 8 * max(y1, y2)],
                           outline=BOX_COLOURS[label], width=2)
        return np.asarray(picture)

    def predictions(self, outputs: dict, meta: dict, *, top_k: int) -> list[dict]:
        names = meta["class_names"]
        rows = []
        for boxes, scores, labels in zip(outputs["boxes"], outputs["scores"], outputs["labels"]):
            keep = labels > 0
            rows.append({"boxes": [[round(float(v), 2) for v in b] for b in boxes[keep]],
                         "labels": [names[int(i)] for i in labels[keep]],
                         "scores": [round(float(v), 4) for v in scores[keep]]})
        return rows


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


if "slot_detection" not in TASKS:
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
    info = DataInfo("slot_detection", "image", (1, SIDE, SIDE), "float32", len(BOX_CLASSES), BOX_CLASSES)
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

    def slots(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(class logits (N, SLOTS, classes), boxes (N, SLOTS, 4) in pixels)."""
        features = self.backbone(images)
        logits = self.classes(features).view(-1, SLOTS, len(BOX_CLASSES))
        return logits, torch.sigmoid(self.boxes(features)).view(-1, SLOTS, 4) * SIDE

    def forward(self, images: torch.Tensor, targets: Optional[list[dict[str, torch.Tensor]]] = None) -> Any:
        logits, boxes = self.slots(images)
        if self.training:
            assert targets is not None, "in training mode the detector takes the targets and returns its losses"
            return self.losses(logits, boxes, targets)
        scores, labels = logits.float().softmax(-1).max(-1)
        return detections(boxes, scores, labels)

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


def detections(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per image, the slots predicted to hold an object (label > 0)."""
    return [{"boxes": b[lab > 0], "labels": lab[lab > 0], "scores": s[lab > 0]} for b, lab, s in zip(boxes, labels, scores)]


class SlotOutputs(nn.Module):
    """The exported detector: every slot's box, score and label (0: empty), fixed shapes for any batch."""

    def __init__(self, model: SlotDetector) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits, boxes = self.model.slots(images)
        scores, labels = logits.float().softmax(-1).max(-1)
        return boxes, scores, labels


def detection_model(info: DataInfo, width: int = 16) -> tuple[nn.Module, InputSpec]:
    return SlotDetector(width), InputSpec(tuple(info.input_shape), torch.float32)


# ---------------------------------------------------------------- volumes

PATCH = 8  # training patches are PATCH^3 voxels
WHOLE = 16  # evaluation volumes are WHOLE^3: larger than the patch, seen through a sliding window


def sliding_window(model: Any, volumes: torch.Tensor, patch: int, overlap: int) -> torch.Tensor:
    """Per-voxel logits of whole volumes (N, C, D, H, W) from a model that takes patch^3 inputs: windows `overlap`
    voxels apart overlapping, each voxel the mean of the windows that cover it (a plain average, as MONAI's
    sliding_window_inference does with mode="constant")."""
    n, _, *size = volumes.shape
    stride = patch - overlap
    starts = [sorted({*range(0, s - patch + 1, stride), s - patch}) for s in size]
    total = count = None
    for z in starts[0]:
        for y in starts[1]:
            for x in starts[2]:
                out = model(volumes[:, :, z:z + patch, y:y + patch, x:x + patch]).float()
                if total is None:
                    total = volumes.new_zeros((n, out.shape[1], *size), dtype=torch.float32)
                    count = volumes.new_zeros((1, 1, *size), dtype=torch.float32)
                total[:, :, z:z + patch, y:y + patch, x:x + patch] += out
                count[:, :, z:z + patch, y:y + patch, x:x + patch] += 1
    return total / count


class Volume(Task):
    """A sample is (volume (1, D, H, W), labels (D, H, W)); training batches are patches, evaluation batches whole
    volumes, which `forward` reads through a sliding window in eval mode. Per-voxel cross-entropy; Dice of the
    foreground class."""

    name = "volume"
    title = "volume segmentation"
    description = "a class per voxel of a 3-D volume, sliding-window evaluation (test only)"
    metrics = ("loss", "dice")
    default_metric = "dice"
    higher_is_better = frozenset({"dice"})

    def forward(self, model: nn.Module, batch: Any) -> torch.Tensor:
        volumes = batch[0]
        return model(volumes) if model.training else sliding_window(model, volumes, PATCH, PATCH // 2)

    def loss(self, output, target, *, label_smoothing=0.0, reduction="mean"):
        return F.cross_entropy(output, target, label_smoothing=label_smoothing, reduction=reduction)

    def example_target(self, info: Any, batch_size: int) -> torch.Tensor:
        return torch.zeros((batch_size, *info.input_shape[1:]), dtype=torch.long)

    def evaluation(self, info: Any) -> Evaluation:
        return DiceEvaluation(self)

    # export: the patch model as trained (patch^3 inputs, any batch); predict slides it over each whole volume with
    # the same windows and averaging as evaluation
    quality = ("dice", "dice", "test Dice of the foreground")
    prediction_columns = ("shape", "voxels")

    def serve(self, run: Any, feeds: dict, meta: dict) -> dict:
        patch = int(meta["input_shape"][1])
        volumes = torch.from_numpy(feeds["input"])
        if min(volumes.shape[2:]) < patch:
            from trainforge.errors import UserError

            raise UserError(f"INPUT: volumes of {list(volumes.shape[2:])} voxels; the model needs at least {patch} a side")

        def patch_logits(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(run({"input": x.contiguous().numpy()})["logits"])

        return {"logits": sliding_window(patch_logits, volumes, patch, patch // 2).numpy()}

    def score_outputs(self, outputs: dict, batch: Any, info: Any) -> dict:
        evaluation = self.evaluation(info)
        evaluation.add(torch.from_numpy(outputs["logits"]), batch[1])
        return {**evaluation.result(False), "loss": evaluation.mean_loss}

    def predictions(self, outputs: dict, meta: dict, *, top_k: int) -> list[dict]:
        names = meta["class_names"]
        rows = []
        for logits in outputs["logits"]:
            counts = np.bincount(logits.argmax(0).ravel(), minlength=len(names))
            rows.append({"shape": list(logits.shape[1:]), "voxels": {n: int(c) for n, c in zip(names, counts)}})
        return rows


class DiceEvaluation(Evaluation):
    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.overlap = self.sizes = 0

    def add(self, output: torch.Tensor, target: torch.Tensor) -> None:
        super().add(output, target)
        predicted, wanted = output.argmax(1) == 1, target == 1
        self.overlap += int((predicted & wanted).sum())
        self.sizes += int(predicted.sum() + wanted.sum())

    def result(self, detailed: bool) -> dict[str, Any]:
        return {"dice": 2 * self.overlap / self.sizes if self.sizes else 1.0}


if "volume" not in TASKS:
    register_task(Volume)


class VolumeSamples(Dataset):
    """Noisy volumes holding one bright ball (label 1 inside it, 0 outside); `side` voxels a side."""

    def __init__(self, num_samples: int, side: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        grid = torch.stack(torch.meshgrid(*[torch.arange(side, dtype=torch.float32)] * 3, indexing="ij"))
        self.items = []
        for _ in range(num_samples):
            center = torch.rand(3, generator=g) * side
            radius = 2.0 + torch.rand((), generator=g) * side / 4
            inside = ((grid - center[:, None, None, None]) ** 2).sum(0) <= radius ** 2
            volume = 0.5 * torch.randn((1, side, side, side), generator=g) + inside.float()
            self.items.append((volume, inside.long()))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.items[key[1] if isinstance(key, tuple) else key]


def volume_data(num_samples: int = 128, seed: int = 0) -> DataBundle:
    info = DataInfo("volume", "image", (1, PATCH, PATCH, PATCH), "float32", 2, ("background", "ball"))
    return DataBundle(info, VolumeSamples(num_samples, PATCH, seed), VolumeSamples(8, WHOLE, seed + 1),
                      VolumeSamples(8, WHOLE, seed + 2), report={"source": "volume test data"})


def volume_model(info: DataInfo, width: int = 16) -> tuple[nn.Module, InputSpec]:
    model = nn.Sequential(nn.Conv3d(1, width, 3, padding=1), nn.ReLU(), nn.Conv3d(width, width, 3, padding=1),
                          nn.ReLU(), nn.Conv3d(width, 2, 1))
    return model, InputSpec(tuple(info.input_shape), torch.float32)


# ---- a modality: waveforms (C, T) -------------------------------------------------------------------------------

WAVE = (2, 32)  # channels, time steps


class TimeReversal:
    """data.augment.hflip on a waveform: the signal reversed in time with that probability, drawn from `g`."""

    def __init__(self, p: float) -> None:
        self.p = p

    def __call__(self, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        return x.flip(-1) if float(torch.rand((), generator=g)) < self.p else x


class Waveform(Modality):
    name = "waveform"
    description = "sampled signals (C, T): normalized per channel, reversed in time (test only)"
    spatial_dims = 1
    scaled = True

    def augmenter(self, cfg: Any, info: Any, value_range: tuple[float, float], task: Any) -> tuple[Any, tuple[str, ...], str]:
        return (TimeReversal(cfg.hflip) if cfg.hflip else None), ("hflip",), "a waveform takes data.augment.hflip"


if "waveform" not in MODALITIES:
    register_modality(Waveform)


def waveform_data(num_samples: int = 256, seed: int = 0) -> Pool:
    """Label 1: channel 0 is a sine of 6 cycles over the window, label 0: of 1 cycle (random phase, noise); time
    reversal keeps the label. Channel 1 is 100 + 10 * noise: only per-channel normalization makes both comparable."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (num_samples,), generator=g)
    t = torch.arange(WAVE[1], dtype=torch.float32) / WAVE[1]
    phase = torch.rand((num_samples, 1), generator=g) * 2 * math.pi
    cycles = torch.where(labels == 1, 6.0, 1.0)[:, None]
    signal = torch.sin(2 * math.pi * cycles * t + phase) + 0.1 * torch.randn((num_samples, WAVE[1]), generator=g)
    x = torch.stack([signal, 100 + 10 * torch.randn((num_samples, WAVE[1]), generator=g)], dim=1)
    info = DataInfo("classification", "waveform", WAVE, "float32", 2, ("slow", "fast"))
    return Pool(info, TensorSamples(x, labels), labels=labels.numpy(), rows_read=num_samples)


def waveform_model(info: DataInfo, width: int = 16) -> tuple[nn.Module, InputSpec]:
    model = nn.Sequential(nn.Conv1d(info.input_shape[0], width, 5, padding=2), nn.ReLU(),
                          nn.Conv1d(width, width, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                          nn.Linear(width, info.num_classes))
    return model, InputSpec(tuple(info.input_shape), torch.float32)
