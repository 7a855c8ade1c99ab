"""`model.quantize_base` (QLoRA): LoRA adapters on a tiny local Llama whose frozen block Linears are NF4 (or int8)
tensors from torchao. The base is quantized after its SHA-256 is taken and the adapters are in, stays bit-identical
through training, costs well under a third of fp32's bytes; the model's logits stay within NF4's error of the
unquantized LoRA model's; final/hf is the merged, dequantized model; a resumed run is bit-identical."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainforge
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.models.lora import weights_sha256
from trainforge.models.quantize_base import (base_bytes_per_param, is_quantized, quantize_base, quantized_bytes)
from trainforge.training.artifacts import load_trained
from trainforge.engine.checkpoint import load_model_weights
from trainforge.training.loop import FitHooks

from test_lora import LORA, files  # noqa: F401  (the module's tiny Llama and corpus: the same as LoRA's tests)
from test_lora import overrides as lora_overrides
from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor

BLOCK_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def overrides(files, *extra: str) -> list[str]:
    """LoRA's tiny run (tests/models/test_lora.py) on an NF4 base."""
    return lora_overrides(files, "model.quantize_base=nf4", *extra)


def train(files, run_dir: Path, *extra: str, resume=None, hooks=None):
    return trainforge.train(trainforge.load_config(None, overrides(files, *extra)), run_dir=run_dir, resume=resume,
                            hooks=hooks)


def inner(t: NF4Tensor) -> list[torch.Tensor]:
    names, _ = t.__tensor_flatten__()
    return [getattr(t, n).clone() for n in names]


@pytest.fixture(scope="module")
def qlora(files, tmp_path_factory):
    """One nf4 run of 6 steps; the model it trained (built through the registry, as without hooks) and the NF4
    base weights as they were built, before any step."""
    cfg = trainforge.load_config(None, overrides(files, "train.max_steps=6"))
    built = []

    def build(info):
        model = build_model(cfg.model, info)[0]
        built.append((model, {n: inner(p) for n, p in model.named_parameters() if isinstance(p, NF4Tensor)}))
        return model

    run_dir = tmp_path_factory.mktemp("run") / "run"
    trainforge.train(cfg, run_dir=run_dir, hooks=FitHooks(build_model=build))
    model, before = built[0]
    return {"run_dir": run_dir, "model": model, "before": before}


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "train"]


def test_nf4_quantizes_the_frozen_base_which_stays_bit_identical_while_the_adapters_train(files, qlora):
    model, before = qlora["model"], qlora["before"]
    quantized = {n: p for n, p in model.named_parameters() if isinstance(p, NF4Tensor)}
    # every Linear of the two blocks, the LoRA-wrapped ones' base layers included; not the embeddings, not lm_head
    assert len(quantized) == 2 * len(BLOCK_LINEARS)
    assert {n.split(".")[-2] if "base_layer" not in n else n.split(".")[-3] for n in quantized} == set(BLOCK_LINEARS)
    assert all("base_layer" in n for n in quantized if ".q_proj." in n or ".v_proj." in n)
    assert not any("embed" in n or "lm_head" in n for n in quantized)
    assert sum(quantized_bytes(p) for p in quantized.values()) < 0.3 * sum(4 * p.numel() for p in quantized.values())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # trained: the NF4 data, scalers and constants are those the base was built with, bit for bit
    assert before.keys() == quantized.keys()
    for name, p in quantized.items():
        assert all(torch.equal(a, b) for a, b in zip(before[name], inner(p))), name
    assert all(p.abs().sum() > 0 for n, p in model.named_parameters() if ".lora_B." in n)  # B starts at 0: moved
    losses = [loss for _, loss in train_losses(qlora["run_dir"])]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert min(losses[3:]) < losses[0]
    # the base reference names the published weights (taken before quantizing), and checkpoints hold adapters only
    from transformers import AutoModelForCausalLM

    published = weights_sha256(AutoModelForCausalLM.from_pretrained(files["llama"]))
    assert json.loads((qlora["run_dir"] / "final" / "model.json").read_text())["base"]["sha256"] == published
    saved = load_file(str(qlora["run_dir"] / "checkpoints" / "step-000006" / "model.safetensors"))
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)


def test_qlora_logits_are_within_nf4_error_of_lora_and_final_hf_is_the_dequantized_merge(files, qlora):
    """The same adapters on the unquantized base: NF4 moves the tiny model's logits by ~5% (relative L2, measured
    0.049; bound 0.1), not more. final/hf is the adapters merged into the *dequantized* base, so it reproduces the
    QLoRA model to float rounding (measured 1e-7; bound 1e-5) and the unquantized LoRA model only to NF4's error."""
    from transformers import AutoModelForCausalLM

    trained = load_trained(qlora["run_dir"])
    quantized = trained.build_model().eval()
    assert sum(isinstance(p, NF4Tensor) for p in quantized.parameters()) == 2 * len(BLOCK_LINEARS)
    plain = build_model(trained.config.model.model_copy(update={"quantize_base": "none"}), trained.info)[0].eval()
    load_model_weights(plain, load_file(str(qlora["run_dir"] / "final" / "model.safetensors")))
    assert not any(is_quantized(p) for p in plain.parameters())
    x = torch.randint(0, 300, (4, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q, lora = quantized(x), plain(x)
        merged_model = AutoModelForCausalLM.from_pretrained(qlora["run_dir"] / "final" / "hf").eval()
        merged = merged_model(x).logits
        base = AutoModelForCausalLM.from_pretrained(files["llama"]).eval()(x).logits
    relative = ((q - lora).norm() / lora.norm()).item()
    assert 1e-3 < relative < 0.1  # quantized for real, and within NF4's error
    assert (base - lora).abs().max() > 3 * (q - lora).abs().max()  # the adapters matter more than the quantization
    assert all(p.dtype == torch.float32 and not is_quantized(p) for p in merged_model.parameters())
    assert (merged - q).abs().max() < 1e-5
    assert (merged - lora).abs().max() > 1e-3


def test_a_resumed_qlora_run_is_bit_identical(files, qlora, tmp_path):
    """The run as it was after its step-3 checkpoint, resumed: the base is quantized again (deterministically) and
    the losses and adapters are those of the run that never stopped."""
    run_dir = tmp_path / "resumed"
    shutil.copytree(qlora["run_dir"], run_dir, ignore=shutil.ignore_patterns("final", "step-000006"))
    (run_dir / "checkpoints" / "latest").write_text("step-000003")
    train(files, run_dir, "train.max_steps=6", resume="auto")
    assert [s for s, _ in train_losses(run_dir)] == list(range(1, 7))
    assert train_losses(run_dir) == train_losses(qlora["run_dir"])
    a = load_file(str(qlora["run_dir"] / "final" / "model.safetensors"))
    b = load_file(str(run_dir / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_int8_trains_and_quantize_base_needs_lora_and_torchao(files, tmp_path, monkeypatch):
    result = train(files, tmp_path / "int8", "model.quantize_base=int8", "train.max_steps=3")
    losses = [loss for _, loss in train_losses(result.run_dir)]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    model = load_trained(result.run_dir).build_model()
    quantized = [p for p in model.parameters() if is_quantized(p)]
    assert len(quantized) == 2 * len(BLOCK_LINEARS) and all(p.dtype == torch.float32 for p in quantized)
    assert sum(quantized_bytes(p) for p in quantized) < 0.3 * sum(4 * p.numel() for p in quantized)

    with pytest.raises(UserError, match=r"^model.quantize_base: quantizing the frozen base needs model.lora;[^\n]*$"):
        trainforge.load_config(None, [o for o in overrides(files) if o != LORA])

    linear = torch.nn.Sequential(torch.nn.Linear(64, 64)).requires_grad_(False)
    with torch.device("meta"):  # the planner: nothing is quantized (it counts base_bytes_per_param instead)
        assert quantize_base(torch.nn.Sequential(torch.nn.Linear(64, 64)).requires_grad_(False), "nf4") == []
    assert base_bytes_per_param("nf4") == pytest.approx(0.5 + 1 / 64 + 4 / 64 / 256)
    assert base_bytes_per_param("int8", in_features=4096) == pytest.approx(1 + 5 / 4096)
    for module in ("torchao.quantization.quantize_.workflows.nf4.nf4_tensor", "torchao.dtypes.nf4tensor"):
        monkeypatch.setitem(sys.modules, module, None)  # torchao absent
    with pytest.raises(UserError, match=r"^model.quantize_base: .*pip install torchao[^\n]*$"):
        quantize_base(linear, "nf4")
