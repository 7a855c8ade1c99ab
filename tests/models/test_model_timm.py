"""`model.name: timm`: timm's zoo through the code users run, with weights saved locally (nothing downloads)."""
from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

import trainforge
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.config import ModelConfig

GRAY = DataInfo("classification", "image", (1, 32, 32), "float32", 4, ("a", "b", "c", "d"))


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """'Pretrained' weights of timm's tiny test_resnet (RGB, 1000 classes), as a hub checkpoint would be."""
    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("timm") / "test_resnet.safetensors"
    save_file(timm.create_model("test_resnet", pretrained=False).state_dict(), str(path))
    return path


def timm_cfg(**args) -> ModelConfig:
    return ModelConfig(name="timm", args={"arch": "test_resnet", **args})


def test_weights_from_a_file_load_with_a_new_head_and_an_adapted_stem(weights):
    from safetensors.torch import load_file

    model, spec = build_model(timm_cfg(pretrained=str(weights)), GRAY)
    saved, own = load_file(str(weights)), model.state_dict()
    body = [k for k in saved if not k.startswith(("fc.", "conv1.", "stem."))]
    assert body and all(torch.equal(own[k], saved[k]) for k in body)  # the pretrained body, exactly
    assert model.get_classifier().out_features == 4 and model(spec.example(2)).shape == (2, 4)
    stem = next(k for k in own if own[k].dim() == 4)
    assert own[stem].shape[1] == 1  # RGB weights adapted to one channel


def test_bad_names_and_files_are_one_line(tmp_path):
    with pytest.raises(UserError, match="model.args.arch: 'test_resnett' is not a timm model; similar: test_resnet"):
        build_model(timm_cfg(arch="test_resnett"), GRAY)
    with pytest.raises(UserError, match="is not a file"):
        build_model(timm_cfg(pretrained=str(tmp_path / "missing.safetensors")), GRAY)
    with pytest.raises(UserError, match="HF_HUB_OFFLINE is set.*hf download timm/test_resnet"):
        build_model(timm_cfg(pretrained=True), GRAY)
    other = tmp_path / "vit.safetensors"
    save_file(timm.create_model("test_vit", pretrained=False).state_dict(), str(other))
    with pytest.raises(UserError, match="does not hold weights of test_resnet"):
        build_model(timm_cfg(pretrained=str(other)), GRAY)


def test_on_the_meta_device_no_weights_are_read(weights, monkeypatch):
    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read on the meta device")

    monkeypatch.setattr(timm.models._builder, "load_pretrained", no_weights)
    with torch.device("meta"):
        model, _ = build_model(timm_cfg(pretrained=str(weights)), GRAY)
    assert next(model.parameters()).device.type == "meta"


def test_fine_tuning_a_timm_model_on_digits(tmp_path, weights):
    cfg = trainforge.load_config(None, ["model.name=timm", f"model.args={{arch: test_resnet, pretrained: {weights}}}",
                                        "train.max_steps=3", "train.global_batch_size=16", "train.micro_batch_size=16",
                                        "train.early_stopping=null", "log.progress=false", "log.tensorboard=false", "log.report=false"])
    result = trainforge.train(cfg, run_dir=tmp_path / "run")
    assert result.status == "completed" and 0 <= result.eval["accuracy"] <= 1
    assert trainforge.evaluate(result.run_dir)["accuracy"] == result.eval["accuracy"]


def test_timms_own_weights_come_from_the_cache_without_asking_the_hub(weights, tmp_path, monkeypatch):
    """`pretrained: true` with the weights in the Hugging Face cache (as `hf download timm/...` leaves them):
    loaded from there, even with the hub reachable in principle, and no connection is attempted."""
    import huggingface_hub.constants
    from safetensors.torch import load_file

    from trainforge import hub

    hub.hub_unreachable.cache_clear()  # a remembered answer would hide a connection attempt
    snapshot = tmp_path / "hub" / "models--timm--test_resnet.r160_in1k" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").write_bytes(weights.read_bytes())
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def no_network(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr("socket.create_connection", no_network)
    monkeypatch.setattr(timm.models._builder, "download_cached_file", no_network)
    model, _ = build_model(timm_cfg(pretrained=True), GRAY)
    saved = load_file(str(weights))
    assert torch.equal(model.state_dict()["layer1.0.conv1.weight"], saved["layer1.0.conv1.weight"])


def test_an_unreachable_hub_is_one_line_at_once(monkeypatch):
    """Not cached, HF_HUB_OFFLINE unset, no route to the hub: one line within seconds, not a minute of retries."""
    import time

    from trainforge import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens, refused at once
    hub.hub_unreachable.cache_clear()
    start = time.monotonic()
    with pytest.raises(UserError, match=r"timm's weights for 'test_vit'.*127.0.0.1:9 could not be reached"):
        build_model(ModelConfig(name="timm", args={"arch": "test_vit", "pretrained": True}), GRAY)
    assert time.monotonic() - start < hub.HUB_CONNECT_TIMEOUT_S + 2
    hub.hub_unreachable.cache_clear()
