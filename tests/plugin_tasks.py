"""Test-only tasks (issue 41, point 6), not shipped: importing this module registers them, and a run imports it
through its `data.target` and `model.target` (tests put this folder on PYTHONPATH for the runs they start).

    fusion: a class from two inputs of different modalities, an 8x8 image and a feature vector, fused late by a
            tiny model (an encoder per input, one head), as issue 29's fusion models are.

Each task's data has a known answer, so a test can tell learning from noise.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainforge.data.base import DataBundle, DataInfo, InputInfo
from trainforge.models.base import InputSpec, NamedInputs
from trainforge.tasks import TASKS, register_task
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
