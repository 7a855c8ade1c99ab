"""Every factory builds and runs without real memory: on the meta device and under FakeTensorMode,
as the planner uses them (so no `.to()` and no data-dependent tricks inside factories)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo, InputInfo
from trainforge.models import MODELS, build_model

IMAGES = DataInfo("classification", "image", (3, 32, 32), "float32", 10)
TEXT = DataInfo("classification", "text", (32,), "int64", 4, vocab_size=100, seq_len=32)
LM = DataInfo("lm", "text", (32,), "int64", 100, vocab_size=100, seq_len=32)
MASKS = DataInfo("segmentation", "image", (3, 32, 32), "float32", 3, ("background", "box", "disc"))
DRIVES = DataInfo("classification", "multimodal", (3, 16, 16), "float32", 2, ("go", "stop"),
                  inputs=(InputInfo("camera", (3, 16, 16), "float32", "image"),
                          InputInfo("features", (5,), "float32", "tabular")))
VOLUMES = DataInfo("classification", "volume", (1, 16, 16, 16), "float32", 2)
POINTS = DataInfo("detection3d", "pointcloud", (200, 8, 4), "float32", 3, ("Car", "Pedestrian", "Cyclist"),
                  pillar_grid=(0.0, -10.24, -3.0, 10.24, 10.24, 1.0, 0.32, 0.32, 4.0, 8, 200, 400))

CASES = {
    "mlp": (IMAGES, {}),
    "cnn": (IMAGES, {}),
    "resnet": (IMAGES, {}),
    "resnet50": (IMAGES, {"arch": "resnet50"}),
    "vit": (IMAGES, {}),
    "hybrid": (IMAGES, {}),
    "text_transformer": (TEXT, {}),
    "gpt": (LM, {}),
    "hf": (LM, {"pretrained": False, "config": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                                 "num_hidden_layers": 2, "num_attention_heads": 4,
                                                 "num_key_value_heads": 2, "vocab_size": 100}}),
    "timm": (IMAGES, {"arch": "test_resnet"}),
    "fusion": (DRIVES, {"width": 16}),
    "monai": (VOLUMES, {"arch": "DenseNet121", "init_features": 8, "growth_rate": 4, "block_config": [2, 2]}),
    "segmenter": (MASKS, {"arch": "lraspp_mobilenet_v3_large", "pretrained": False}),
    "pointpillars": (POINTS, {"channels": [16, 32, 32], "layers": [1, 1, 1]}),  # a dict of the heads' maps  # logits (N, classes, H, W)  # timm ViTs compute drop-path rates with .tolist(): no fake tensors
}


def user_factory(info: DataInfo) -> torch.nn.Module:
    """A factory from outside the package, loaded through model.target."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, info.num_classes))


def config(case: str) -> ModelConfig:
    if case == "custom":
        return ModelConfig(name="custom", target=f"{__name__}:user_factory")
    return ModelConfig(name=case.replace("resnet50", "resnet"), args=CASES[case][1])


def blank_input(spec, batch: int):
    if hasattr(spec, "specs"):  # a model of several named inputs: a dict of them
        return {name: blank_input(one, batch) for name, one in spec.specs}
    return torch.zeros((batch, *spec.shape), dtype=spec.dtype)


# a detector picks its proposals by value (nonzero, nms): fake tensors cannot run it, and the planner says so in one
# line (tests/planning/test_unsimulated_tasks.py); it still builds on the meta device (below)
NOT_SIMULATED = {"detector"}


def test_every_model_is_covered():
    assert {case.replace("resnet50", "resnet") for case in CASES} | {"custom"} | NOT_SIMULATED == set(MODELS.names())


def test_a_detector_builds_on_the_meta_device():
    info = DataInfo("detection", "image", (3, 64, 64), "float32", 3)
    with torch.device("meta"):
        model, _ = build_model(ModelConfig(name="detector", args={"pretrained": False}), info)
    assert all(p.is_meta for p in model.parameters())


def outputs(out) -> list:
    """A model's output tensors: one, or a dict of them (a 3D detector's head maps)."""
    return list(out.values()) if isinstance(out, dict) else [out]


def total(out):
    return sum(o.float().sum() for o in outputs(out))


@pytest.mark.parametrize("case", [*CASES, "custom"])
def test_builds_and_runs_on_the_meta_device(case):
    info = CASES.get(case, (IMAGES,))[0]
    with torch.device("meta"):
        model, spec = build_model(config(case), info)
        out = model(blank_input(spec, 2))
        total(out).backward()
    assert all(p.is_meta for p in model.parameters())
    assert all(o.is_meta and o.shape[0] == 2 for o in outputs(out))


@pytest.mark.parametrize("case", [*CASES, "custom"])
def test_builds_and_trains_under_fake_tensors(case):
    info = CASES.get(case, (IMAGES,))[0]
    with FakeTensorMode():
        model, spec = build_model(config(case), info)
        out = model(blank_input(spec, 2))
        total(out).backward()
    assert all(isinstance(p, FakeTensor) for p in model.parameters())
    assert all(p.grad is not None for p in model.parameters())
