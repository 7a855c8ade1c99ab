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


@pytest.mark.parametrize("arch, works, fails", [("DenseNet121", 29, 28), ("resnet10", None, None)])
def test_a_volume_the_network_downsamples_below_one_voxel_is_one_line_with_the_size_that_works(arch, works, fails):
    """Issue 50, Low: data.args.size=[16,16,16] under DenseNet121 is one line naming the smallest size that works
    (found by PyTorch's output-size formula over the network's layers; checked here by real forwards at the edge)."""
    small = DataInfo("classification", "volume", (1, 16, 16, 16), "float32", 2, ("a", "b"))
    if works is None:  # a network that keeps a voxel: builds and runs
        model, spec = build_model(ModelConfig(name="monai", args={"arch": arch}), small)
        assert model(spec.example(2)).shape == (2, 2)
        return
    with pytest.raises(UserError, match=rf"data.args.size: \[16, 16, 16\] is too small for MONAI's {arch}: .* use at "
                                        rf"least {works} voxels a side") as e:
        build_model(ModelConfig(name="monai", args={"arch": arch}), small)
    assert "\n" not in str(e.value)
    for side, ok in ((works, True), (fails, False)):
        info = DataInfo("classification", "volume", (1, side, side, side), "float32", 2, ("a", "b"))
        if not ok:
            with pytest.raises(UserError):
                build_model(ModelConfig(name="monai", args={"arch": arch}), info)
            continue
        model, _ = build_model(ModelConfig(name="monai", args={"arch": arch}), info)
        with torch.no_grad():
            assert model.eval()(torch.zeros(1, 1, side, side, side)).shape == (1, 2)
