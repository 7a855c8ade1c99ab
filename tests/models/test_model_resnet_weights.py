"""The zoo's torchvision ResNets from pretrained weights: a state dict on disk, or torchvision's named sets
(offline here: the hub cache is empty, so naming them is one line saying how to fetch them)."""
from __future__ import annotations

import pytest
import torch
import torchvision

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model

GRAY = DataInfo("classification", "image", (1, 32, 32), "float32", 3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(5)
    path = tmp_path_factory.mktemp("tv") / "resnet18.pth"
    state = torchvision.models.resnet18(weights=None).state_dict()  # RGB, 1000 classes, like ImageNet weights
    torch.save(state, path)
    return path, state


def resnet(**args) -> ModelConfig:
    return ModelConfig(name="resnet", args={"arch": "resnet18", **args})


def test_a_state_dict_file_loads_with_a_new_head_and_the_stem_summed_for_gray(saved):
    path, state = saved
    model, spec = build_model(resnet(weights=str(path)), GRAY)
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in state.items() if not k.startswith(("fc.", "conv1.")))
    torch.testing.assert_close(own["conv1.weight"], state["conv1.weight"].sum(dim=1, keepdim=True))
    assert own["fc.weight"].shape == (3, 512) and model(spec.example(2)).shape == (2, 3)


def test_named_weights_offline_and_wrong_files_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))  # an empty hub cache
    monkeypatch.setattr(torch.hub, "download_url_to_file", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    with pytest.raises(UserError, match=r"resnet18 IMAGENET1K_V1 weights are not in .*torch-home.* copy resnet18-"):
        build_model(resnet(weights="DEFAULT"), GRAY)
    with pytest.raises(UserError, match="'IMAGENET9' is not a weight set of resnet18; choose DEFAULT, IMAGENET1K_V1"):
        build_model(resnet(weights="IMAGENET9"), GRAY)
    other = tmp_path / "r34.pth"
    torch.save(torchvision.models.resnet34(weights=None).state_dict(), other)
    with pytest.raises(UserError, match="does not fit this ResNet"):
        build_model(resnet(weights=str(other)), GRAY)
    with pytest.raises(UserError, match="set model.args.arch"):
        build_model(ModelConfig(name="resnet", args={"weights": "DEFAULT"}), GRAY)


def test_on_the_meta_device_no_weights_are_read(tmp_path):
    with torch.device("meta"):  # the planner's build: the file is never opened
        model, _ = build_model(resnet(weights=str(tmp_path / "absent.pth")), GRAY)
    assert next(model.parameters()).device.type == "meta"
