"""`model.name: hf`: transformers models through the same code users run with hub ids, on tiny models saved
locally (nothing downloads: HF_HUB_OFFLINE=1 for the whole suite, tests/conftest.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig, LlamaConfig

import trainforge
from trainforge.data import build_data
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.planning.simulate import simulate_step

TINY_BERT = dict(model_type="bert", vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=64)
TEXT = ["data.source=synthetic_text", "data.args={task: classification, num_samples: 256, seq_len: 32, "
        "vocab_size: 257, num_classes: 3}", "data.normalize=none", "data.augment.rotation_deg=0",
        "data.augment.crop_scale=null", "train.global_batch_size=16",
        "train.micro_batch_size=16", "train.early_stopping=null", "train.deterministic=true", "log.progress=false",
        "log.tensorboard=false", "log.report=false", "schedule.warmup_steps=0"]


def text_cfg(*extra: str):
    return trainforge.load_config(None, [*TEXT, "model.name=hf", *extra])


@pytest.fixture(scope="module")
def info():
    return build_data(text_cfg(f"model.args={{pretrained: false, config: {TINY_BERT}}}").data, seed=0).info


@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory) -> Path:
    """A 'pretrained' BERT with a 2-class head, saved like a hub checkpoint."""
    torch.manual_seed(1)
    config = BertConfig(**{k: v for k, v in TINY_BERT.items() if k != "model_type"}, num_labels=2)
    path = tmp_path_factory.mktemp("bert")
    AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
    return path


def test_a_local_pretrained_model_loads_its_weights_and_gets_a_head_for_the_data(info, saved_bert):
    model, spec = build_model(text_cfg(f"model.args={{pretrained: {saved_bert}}}").model, info)
    original = AutoModelForSequenceClassification.from_pretrained(saved_bert)
    encoder = {k: v for k, v in original.state_dict().items() if not k.startswith("classifier")}
    own = model.model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in encoder.items())  # the pretrained encoder, exactly
    assert model.model.config.num_labels == 3 and own["classifier.weight"].shape == (3, 32)  # a new head
    assert model.model.config.id2label[0] == info.class_names[0]
    assert model(spec.example(4)).shape == (4, 3)


def test_padding_is_masked_out(info):
    """Logits of 20 tokens padded to 32 equal those of the 20 tokens alone: the pad id is never attended."""
    model, _ = build_model(text_cfg(f"model.args={{pretrained: false, config: {TINY_BERT}}}").model, info)
    model.eval()
    x = torch.randint(1, 257, (1, 32))
    x[0, 20:] = 0  # the byte tokenizer pads with 0
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.model(input_ids=x[:, :20]).logits, rtol=0, atol=1e-6)
    assert model.pad_token_id == 0 and model.model.config.pad_token_id == 0


def test_a_model_that_is_nowhere_is_one_line_naming_it(info, tmp_path):
    with pytest.raises(UserError, match=r"'no-such-org/no-such-model' is neither a local directory nor in the "
                                        r"Hugging Face cache.*HF_HUB_OFFLINE.*hf download no-such-org/no-such-model"):
        build_model(text_cfg("model.args={pretrained: no-such-org/no-such-model}").model, info)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no transformers config"):
        build_model(text_cfg(f"model.args={{pretrained: {tmp_path / 'empty'}}}").model, info)
    with pytest.raises(UserError, match="model.args.config: required with model.args.pretrained: false"):
        build_model(text_cfg("model.args={pretrained: false}").model, info)
    with pytest.raises(UserError, match="needs model_type"):
        build_model(text_cfg("model.args={pretrained: false, config: {hidden_size: 8}}").model, info)
    with pytest.raises(UserError, match="vocabulary \\(100 tokens\\) is smaller than the data's \\(257\\)"):
        build_model(text_cfg(f"model.args={{pretrained: false, config: {dict(TINY_BERT, vocab_size=100)}}}").model, info)


def test_on_the_meta_device_a_pretrained_model_is_built_from_its_config_alone(info, saved_bert, monkeypatch):
    import transformers

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read on the meta device")

    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", no_weights)
    with torch.device("meta"):
        model, _ = build_model(text_cfg(f"model.args={{pretrained: {saved_bert}}}").model, info)
    assert next(model.parameters()).device.type == "meta"


def test_fine_tuning_writes_final_hf_that_transformers_loads_with_the_same_logits(tmp_path, saved_bert, capfd):
    """final/hf reloaded by transformers alone gives trainforge's eval: the same logits on the test split's first
    batch (1e-5) and the same test accuracy, computed here from the reloaded model."""
    result = trainforge.train(text_cfg(f"model.args={{pretrained: {saved_bert}}}", "train.max_steps=4"),
                              run_dir=tmp_path / "run")
    console = capfd.readouterr().err
    assert not any(bar in console for bar in ("Writing model shards", "Loading weights", "KernelPreference"))
    hf_dir = result.run_dir / "final" / "hf"
    assert (hf_dir / "config.json").is_file() and (hf_dir / "manifest.json").is_file()
    reloaded = AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
    trained = trainforge.training.artifacts.load_trained(result.run_dir / "final")
    model = trained.build_model().eval()
    test = build_data(trained.config.data, seed=trained.config.seed, stored=trained.preprocess).test
    x = torch.stack([test[i][0] for i in range(len(test))])
    y = torch.stack([torch.as_tensor(test[i][1]) for i in range(len(test))])
    with torch.no_grad():
        logits = reloaded(input_ids=x, attention_mask=(x != 0).long()).logits
        torch.testing.assert_close(logits[:16], model(x[:16]), rtol=0, atol=1e-5)
    accuracy = (logits.argmax(-1) == y).sum().item() / len(y)
    assert trainforge.evaluate(result.run_dir)["accuracy"] == pytest.approx(accuracy, abs=1e-12) \
        == pytest.approx(result.eval["accuracy"], abs=1e-12)


def test_a_causal_lm_from_a_config_trains_and_is_planned_like_the_zoo(tmp_path):
    llama = dict(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    lm = ["data.source=synthetic_text", "data.args={task: lm, num_samples: 200, seq_len: 32, vocab_size: 64}",
          "data.normalize=none", "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "model.name=hf", f"model.args={{pretrained: false, config: {llama}}}",
          "train.global_batch_size=8", "train.micro_batch_size=8", "train.max_steps=6", "train.early_stopping=null",
          "log.progress=false", "log.tensorboard=false", "log.report=false"]
    cfg = trainforge.load_config(None, lm)
    result = trainforge.train(cfg, run_dir=tmp_path / "lm")
    assert result.status == "completed" and result.eval["perplexity"] < 64  # better than guessing
    info = build_data(cfg.data, seed=0).info
    sim = simulate_step(cfg.model, cfg.optim, info, micro_batch_size=2)
    params = sum(p.numel() for p in build_model(cfg.model, info)[0].parameters())
    assert sim.param_count == params and sim.peak_bytes > params * 16  # weights, grads, two AdamW moments


def test_a_frozen_encoder_stays_as_pretrained_and_costs_the_planner_no_gradients(tmp_path, saved_bert, info, capfd):
    tune = ["train.freeze=[model.bert.embeddings.*, 're:^model\\.bert\\.encoder\\.layer\\.0\\.']",
            "optim.param_groups=[{match: 'model.classifier.*', lr: 0.01}]", "train.max_steps=3"]
    cfg = text_cfg(f"model.args={{pretrained: {saved_bert}}}", *tune)
    result = trainforge.train(cfg, run_dir=tmp_path / "run")
    assert "train.freeze:" in capfd.readouterr().err
    final = AutoModelForSequenceClassification.from_pretrained(result.run_dir / "final" / "hf").state_dict()
    start = AutoModelForSequenceClassification.from_pretrained(saved_bert).state_dict()
    frozen = [k for k in start if k.startswith("bert.embeddings.") or k.startswith("bert.encoder.layer.0.")]
    assert frozen and all(torch.equal(final[k], start[k]) for k in frozen)
    assert not torch.equal(final["bert.encoder.layer.1.output.dense.weight"], start["bert.encoder.layer.1.output.dense.weight"])
    free = simulate_step(text_cfg(f"model.args={{pretrained: {saved_bert}}}").model, cfg.optim, info, micro_batch_size=2)
    held = simulate_step(cfg.model, cfg.optim, info, micro_batch_size=2, freeze_patterns=cfg.train.freeze)
    assert held.breakdown["optimizer_state"] < free.breakdown["optimizer_state"]


def test_a_fine_tuning_run_resumes_bit_for_bit(tmp_path, saved_bert):
    steady = ["schedule.name=constant", f"model.args={{pretrained: {saved_bert}}}"]
    whole = trainforge.train(text_cfg(*steady, "train.max_steps=4"), run_dir=tmp_path / "whole")
    trainforge.train(text_cfg(*steady, "train.max_steps=2"), run_dir=tmp_path / "split")
    resumed = trainforge.train(text_cfg(*steady, "train.max_steps=4"), run_dir=tmp_path / "split", resume="auto")
    assert resumed.steps == 4
    from safetensors.torch import load_file

    a = load_file(str(whole.run_dir / "final" / "model.safetensors"))
    b = load_file(str(resumed.run_dir / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_importing_transformers_and_torchao_under_trainforge_prints_no_library_notes():
    """torchao registers its enums with torch's pytree on import (one deprecation line each, via transformers for
    every hf run); trainforge keeps them off the console, and nothing else it says."""
    import subprocess
    import sys

    code = ("import logging, trainforge, trainforge.models, transformers, torchao\n"
            "logging.getLogger('torch.utils._pytree').warning('a note of its own')\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "Enum subclass" not in err and "a note of its own" in err
