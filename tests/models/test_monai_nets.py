"""model.name: monai: MONAI's 3D classifiers sized from the data; their own arguments checked against MONAI's
signatures, one line each."""
from __future__ import annotations

import pytest
import torch

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model

VOLUMES = DataInfo("classification", "volume", (1, 32, 32, 32), "float32", 3, ("a", "b", "c"))


@pytest.mark.parametrize("args", [
    {"arch": "DenseNet121", "dropout_prob": 0.2, "init_features": 8, "growth_rate": 4},  # kwargs on to DenseNet
    {"arch": "resnet10", "widen_factor": 0.25},  # kwargs on to ResNet
])
def test_a_monai_classifier_takes_the_datas_channels_and_classes(args):
    model, spec = build_model(ModelConfig(name="monai", args=args), VOLUMES)
    out = model(spec.example(2))
    assert out.shape == (2, 3)
    out.sum().backward()


@pytest.mark.parametrize("args, message", [
    ({"arch": "DenseNet121", "dropout": 0.2}, r"model.args.dropout: unknown argument for MONAI's DenseNet121; it takes "
                                              r"arch and .*dropout_prob"),
    ({"arch": "DenseNet121", "out_channels": 5}, r"model.args.out_channels: set from the data \(3 spatial dims, 1 "
                                                 r"channels, 3 classes\); remove it"),
    ({"arch": "UNet"}, r"model.args.arch: 'UNet' is not a MONAI volume classifier"),
])
def test_bad_monai_arguments_are_one_line(args, message):
    with pytest.raises(UserError, match=message) as e:
        build_model(ModelConfig(name="monai", args=args), VOLUMES)
    assert "\n" not in str(e.value)


def test_a_monai_network_builds_on_the_meta_device():
    with torch.device("meta"):
        model, _ = build_model(ModelConfig(name="monai", args={"arch": "DenseNet121"}), VOLUMES)
    assert all(p.is_meta for p in model.parameters())
