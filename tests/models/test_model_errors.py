"""Every user mistake about a model is one `UserError` line naming the field and the fix."""
from __future__ import annotations

import sys

import pytest
from torch import nn

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UnknownNameError, UserError
from trainforge.models import build_model

DIGITS = DataInfo("classification", "image", (1, 8, 8), "float32", 10)
TEXT = DataInfo("classification", "text", (16,), "int64", 4, vocab_size=50, seq_len=16)
LM = DataInfo("lm", "text", (16,), "int64", 64, vocab_size=64, seq_len=16)


def fails(name: str, info: DataInfo = DIGITS, target: str | None = None, **args) -> str:
    with pytest.raises(UserError) as err:
        build_model(ModelConfig(name=name, target=target, args=args), info)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_unknown_name_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        build_model(ModelConfig(name="transformr"), DIGITS)
    assert str(err.value) == (
        "model.name: unknown model 'transformr'; choose one of: "
        "cnn, custom, detector, fusion, gpt, hf, hybrid, mlp, monai, pointpillars, resnet, segmenter, text_transformer, timm, "
        "vit"
    )


def test_unknown_arg_names_the_arg_and_lists_accepted_ones():
    assert fails("cnn", chanels=[8]) == (
        "model.args.chanels: unknown argument for model 'cnn'; accepted: channels, dropout, norm"
    )
    assert fails("gpt", LM, n_layers=2).endswith(
        "accepted: n_layer, n_head, n_embd, vocab_size, block_size, dropout, bias, tie_weights"
    )


@pytest.mark.parametrize(
    ("name", "info", "args", "expected"),
    [
        ("cnn", DIGITS, {"channels": 32}, "model.args.channels: expected a list of positive integers"),
        ("cnn", DIGITS, {"channels": []}, "model.args.channels: expected at least one entry"),
        ("cnn", DIGITS, {"dropout": 1.5}, "model.args.dropout: expected a number in [0, 1), got 1.5"),
        ("mlp", DIGITS, {"activation": "swish"}, "model.args.activation: expected one of gelu, relu, silu, tanh"),
        ("mlp", DIGITS, {"hidden": [64, "x"]}, "model.args.hidden: expected a list of positive integers"),
        ("vit", DIGITS, {"depth": 0}, "model.args.depth: expected a positive integer, got 0"),
        ("vit", DIGITS, {"dim": 30, "heads": 4}, "model.args.heads: 4 heads do not divide dim=30"),
        ("gpt", LM, {"n_embd": 100, "n_head": 3}, "model.args.n_head: 3 heads do not divide n_embd=100"),
        ("gpt", LM, {"bias": "yes"}, "model.args.bias: expected true or false"),
        ("text_transformer", TEXT, {"max_len": 8}, "model.args.max_len: 8 is shorter than the data's 16-token"),
        ("hybrid", DIGITS, {"stem_channels": [0]}, "model.args.stem_channels: expected a list of positive integers"),
    ],
)
def test_bad_arg_values_name_the_arg(name, info, args, expected):
    assert fails(name, info, **args).startswith(expected)


@pytest.mark.parametrize("depth", [2, 10, 21, -4, 7.5])
def test_bad_resnet_depth(depth):
    message = fails("resnet", depth=depth)
    assert message.startswith("model.args.depth:")


def test_resnet_depth_message_explains_6n_plus_2():
    assert "depth 6n+2 (8, 14, 20, 32" in fails("resnet", depth=10)


def test_resnet_arch_is_checked_and_exclusive_with_depth():
    assert fails("resnet", arch="resnet101").startswith("model.args.arch: expected one of resnet18, resnet34, resnet50")
    assert fails("resnet", arch="resnet18", depth=20).startswith("model.args.depth: only for the CIFAR ResNet")


def test_vit_patch_must_divide_the_image():
    message = fails("vit", patch_size=3)
    assert message.startswith("model.args.patch_size: 3 does not divide the 8x8 images; choose one of 1, 2, 4, 8")
    wide = DataInfo("classification", "image", (3, 100, 100), "float32", 2)  # default patch 16 does not fit
    assert fails("vit", wide).startswith("model.args.patch_size: 16 does not divide the 100x100 images")


@pytest.mark.parametrize(
    ("name", "info", "fit"),
    [
        ("gpt", DIGITS, "models that fit: cnn, custom, hf, hybrid, mlp, resnet, timm, vit"),
        ("cnn", LM, "models that fit: custom, gpt, hf"),
        ("text_transformer", DIGITS, "models that fit: cnn, custom, hf, hybrid, mlp, resnet, timm, vit"),
        ("vit", TEXT, "models that fit: custom, hf, text_transformer"),
        ("mlp", TEXT, "models that fit: custom, hf, text_transformer"),
    ],
)
def test_model_data_mismatch_lists_models_that_fit(name, info, fit):
    message = fails(name, info)
    assert message.startswith(f"model.name: {name} needs ")
    assert message.endswith(fit)


def test_gpt_on_images_says_what_it_needs():
    assert fails("gpt", DIGITS) == (
        "model.name: gpt needs language modelling (task lm, int64 token inputs), but the data is image "
        "classification with float32 inputs of shape 1x8x8; models that fit: cnn, custom, hf, hybrid, mlp, resnet, timm, vit"
    )


def test_target_without_custom_name():
    assert fails("cnn", target="pkg.mod:f").startswith("model.target: only used with model.name: custom")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (None, "model.target: required for a custom model; set it to 'pkg.module:factory'"),
        ("user_models", "model.target: expected 'pkg.module:factory'"),
        ("a:b:c", "model.target: expected 'pkg.module:factory'"),
        (":build", "model.target: expected 'pkg.module:factory'"),
        ("no_such_module_for_trainforge:build", "model.target: cannot import module 'no_such_module_for_trainforge'"),
        ("user_models:missing", "model.target: module 'user_models' has no attribute 'missing'"),
        ("user_models:NOT_CALLABLE", "model.target: user_models:NOT_CALLABLE is not callable"),
        ("user_models:returns_string", "model.target: user_models:returns_string returned str; a model factory"),
    ],
)
def test_bad_custom_target(target, expected, user_models):
    assert fails("custom", target=target).startswith(expected)


def test_custom_args_are_checked_against_the_users_factory(user_models):
    message = fails("custom", target="user_models:build", widht=3)
    assert message == "model.args.widht: unknown argument for user_models:build(info, width=4); accepted: width"
    assert fails("custom", target="user_models:needs_size").startswith(
        "model.args.size: required by user_models:needs_size(info, size); set model.args.size, or name the "
        "parameter after what the run provides (class_names, image_size, in_channels, "
    )


def test_custom_module_is_imported_only_when_named(user_models):
    build_model(ModelConfig(name="cnn"), DIGITS)
    assert "user_models" not in sys.modules
    model, _ = build_model(ModelConfig(name="custom", target="user_models:build", args={"width": 3}), DIGITS)
    assert "user_models" in sys.modules
    assert isinstance(model, nn.Module)


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "user_models.py").write_text(
        "from torch import nn\n"
        "NOT_CALLABLE = 3\n"
        "def build(info, width=4):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.Linear(width, info.num_classes))\n"
        "def needs_size(info, size):\n"
        "    return nn.Linear(size, info.num_classes)\n"
        "def returns_string(info):\n"
        "    return 'a model'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_models", raising=False)
    yield
    sys.modules.pop("user_models", None)


def test_text_transformer_rejects_longer_inputs():
    import torch

    model, _ = build_model(ModelConfig(name="text_transformer"), TEXT)
    with pytest.raises(UserError, match=r"model\.args\.max_len: got sequences of 20 tokens but max_len is 16"):
        model(torch.ones(1, 20, dtype=torch.long))
