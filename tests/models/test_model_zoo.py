"""Every registered model builds from its defaults, runs forward and backward, and trains every parameter."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.models import MODELS, build_model, is_convolutional, models_that_fit
from trainforge.models.base import InputSpec

DIGITS = DataInfo("classification", "image", (1, 8, 8), "float32", 10)
RGB32 = DataInfo("classification", "image", (3, 32, 32), "float32", 5)
TABULAR = DataInfo("classification", "tabular", (12,), "float32", 3)
VOLUMES = DataInfo("classification", "volume", (1, 12, 16, 20), "float32", 3)
TEXT = DataInfo("classification", "text", (16,), "int64", 4, vocab_size=50, seq_len=16)
LM = DataInfo("lm", "text", (16,), "int64", 64, vocab_size=64, seq_len=16)


def tiny_custom(info: DataInfo, hidden: int = 8) -> nn.Module:
    """The test suite's user factory (model.target points here); returns a bare module."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(info.input_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, info.num_classes)
    )


CUSTOM_TARGET = f"{__name__}:tiny_custom"

# name -> (data, extra config); every model runs on its defaults except where noted
CASES: dict[str, tuple[DataInfo, dict]] = {
    "mlp": (TABULAR, {}),
    "cnn": (DIGITS, {}),
    "resnet": (DIGITS, {}),
    "vit": (DIGITS, {}),
    "hybrid": (RGB32, {}),
    "text_transformer": (TEXT, {}),
    "gpt": (LM, {}),
    "custom": (TABULAR, {"target": CUSTOM_TARGET, "args": {"hidden": 6}}),
    "hf": (TEXT, {"args": {"pretrained": False, "config": {  # a transformers BERT from an inline config
        "model_type": "bert", "vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 32}}}),
    "timm": (RGB32, {"args": {"arch": "test_resnet"}}),  # timm's tiny test architecture, random weights
    "monai": (VOLUMES, {"args": {"arch": "DenseNet", "init_features": 8, "growth_rate": 4, "block_config": [2, 2]}}),
}


def expected_logits_shape(info: DataInfo, batch: int) -> tuple[int, ...]:
    if info.task == "lm":
        return (batch, info.seq_len, info.vocab_size)
    return (batch, info.num_classes)


def loss_of(logits: torch.Tensor, info: DataInfo, batch: int) -> torch.Tensor:
    if info.task == "lm":
        y = torch.randint(0, info.vocab_size, (batch, info.seq_len))
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())
    return F.cross_entropy(logits, torch.randint(0, info.num_classes, (batch,)))


ELSEWHERE = {"fusion": "tests/e2e/test_fusion.py", "detector": "tests/models/test_detectors.py", "segmenter": "tests/models/test_segmenters.py",
             "pointpillars": "tests/perception3d/test_pointpillars_net.py"}  # not a classifier or an LM: tested through its task there


def test_every_registered_model_has_a_case():
    assert sorted([*CASES, *ELSEWHERE]) == MODELS.names()


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_backward(name):
    info, extra = CASES[name]
    model, spec = build_model(ModelConfig(name=name, **extra), info)
    assert spec.shape == info.input_shape
    assert spec.dtype == (torch.int64 if info.input_dtype == "int64" else torch.float32)
    x = spec.example(4)
    logits = model(x)
    assert logits.shape == expected_logits_shape(info, 4)
    loss = loss_of(logits, info, 4)
    assert torch.isfinite(loss)
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {pname} has a non-finite gradient"
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())


def test_token_spec_is_bounded_by_vocabulary():
    _, spec = build_model(ModelConfig(name="gpt"), LM)
    assert spec == InputSpec((16,), torch.int64, high=64)
    assert int(spec.example(8).max()) < 64


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32), (3, 24, 40), (3, 1, 1)])
@pytest.mark.parametrize("name", ["cnn", "resnet", "hybrid", "mlp"])
def test_image_models_take_any_image_size(name, shape):
    info = DataInfo("classification", "image", shape, "float32", 7)
    model, spec = build_model(ModelConfig(name=name), info)
    model.eval()
    with torch.no_grad():
        assert model(spec.example(2)).shape == (2, 7)


@pytest.mark.parametrize("name", ["cnn", "resnet", "vit", "hybrid"])
def test_imagenet_sized_inputs_build_and_run(name):
    info = DataInfo("classification", "image", (3, 224, 224), "float32", 1000)
    with torch.device("meta"):  # shapes only: no memory, no compute
        model, spec = build_model(ModelConfig(name=name), info)
        assert model(torch.empty(2, *spec.shape)).shape == (2, 1000)


def test_vit_default_patch_sizes():
    def tokens(side: int) -> int:
        info = DataInfo("classification", "image", (3, side, side), "float32", 2)
        with torch.device("meta"):
            model, _ = build_model(ModelConfig(name="vit"), info)
        return model.pos_emb.shape[1] - 1  # minus the cls token

    assert tokens(8) == (8 // 2) ** 2
    assert tokens(32) == (32 // 4) ** 2
    assert tokens(224) == (224 // 16) ** 2


def test_hybrid_token_grid_is_small():
    info = DataInfo("classification", "image", (3, 224, 224), "float32", 2)
    with torch.device("meta"):
        model, _ = build_model(ModelConfig(name="hybrid"), info)
    assert model.pos_emb.shape[1] == 64


@pytest.mark.parametrize("arch", ["resnet18", "resnet34", "resnet50"])
def test_torchvision_resnets_adapt_the_first_conv(arch):
    info = DataInfo("classification", "image", (1, 32, 32), "float32", 3)
    with torch.device("meta"):
        model, _ = build_model(ModelConfig(name="resnet", args={"arch": arch}), info)
    assert model.conv1.in_channels == 1
    assert model.fc.out_features == 3


def test_torchvision_resnet18_trains_on_grayscale():
    info = DataInfo("classification", "image", (1, 16, 16), "float32", 3)
    model, spec = build_model(ModelConfig(name="resnet", args={"arch": "resnet18"}), info)
    loss = F.cross_entropy(model(spec.example(2)), torch.tensor([0, 2]))
    loss.backward()
    assert model.conv1.weight.grad is not None


def test_cifar_resnet_depth_sets_the_block_count():
    from trainforge.models.resnet import BasicBlock

    for depth in (8, 14, 32):
        with torch.device("meta"):
            model, _ = build_model(ModelConfig(name="resnet", args={"depth": depth}), RGB32)
        assert sum(isinstance(m, BasicBlock) for m in model.modules()) == (depth - 2) // 2
    with torch.device("meta"):
        wide, _ = build_model(ModelConfig(name="resnet", args={"depth": 8, "width": 2}), RGB32)
    assert wide.fc.in_features == 128


def test_text_transformer_ignores_padding():
    model, _ = build_model(ModelConfig(name="text_transformer", args={"dropout": 0.0}), TEXT)
    model.eval()
    real = torch.tensor([[5, 9, 3, 7, 0, 0, 0, 0]])
    padded = torch.cat([real, torch.zeros(1, 8, dtype=torch.long)], dim=1)
    all_pad = torch.zeros(1, 16, dtype=torch.long)
    with torch.no_grad():
        assert torch.allclose(model(real), model(padded), atol=1e-5)
        assert torch.isfinite(model(all_pad)).all()
        other = real.clone()
        other[0, 1] = 11
        assert not torch.allclose(model(real), model(other), atol=1e-5)


def test_is_convolutional():
    image_models = ("cnn", "resnet", "vit", "hybrid", "mlp")
    conv = {name for name in image_models if is_convolutional(build_model(ModelConfig(name=name), DIGITS)[0])}
    assert conv == {"cnn", "resnet", "vit", "hybrid"}  # vit cuts patches with a strided conv
    assert not is_convolutional(build_model(ModelConfig(name="gpt"), LM)[0])
    assert not is_convolutional(build_model(ModelConfig(name="text_transformer"), TEXT)[0])


def test_models_that_fit():
    assert models_that_fit(DIGITS) == ["cnn", "custom", "hf", "hybrid", "mlp", "resnet", "timm", "vit"]
    assert models_that_fit(TABULAR) == ["custom", "mlp"]
    assert models_that_fit(TEXT) == ["custom", "hf", "text_transformer"]
    assert models_that_fit(LM) == ["custom", "gpt", "hf"]


def test_custom_factory_may_return_its_own_spec(tmp_path, monkeypatch):
    (tmp_path / "user_models_spec.py").write_text(
        "import torch\nfrom torch import nn\nfrom trainforge.models.base import InputSpec\n"
        "def build(info):\n"
        "    return nn.Linear(5, info.num_classes), InputSpec((5,), torch.float32)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    model, spec = build_model(ModelConfig(name="custom", target="user_models_spec:build"), TABULAR)
    assert spec.shape == (5,)
    assert model(spec.example(2)).shape == (2, 3)
