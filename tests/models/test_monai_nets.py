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


def test_a_3d_segmenter_trained_on_patches_slides_over_a_whole_volume_in_evaluation():
    from monai.inferers import sliding_window_inference

    info = DataInfo("segmentation", "volume", (1, 16, 16, 16), "float32", 2, ("background", "lesion"))
    torch.manual_seed(0)
    model, spec = build_model(ModelConfig(name="monai", args={"arch": "UNet", "channels": [4, 8, 16, 32]}), info)
    patch, whole = spec.example(2), torch.randn(1, 1, 24, 32, 24)
    assert model(patch).shape == (2, 2, 16, 16, 16)  # training: the network itself on a patch
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(patch), model.net(patch))  # a patch-sized input: no windows
        slid = model(whole)
        want = sliding_window_inference(whole, (16, 16, 16), 1, model.net, overlap=0.25, mode="gaussian")
    assert slid.shape == (1, 2, 24, 32, 24)
    torch.testing.assert_close(slid, want)
