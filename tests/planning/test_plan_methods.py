"""Fine-tuning methods side by side (issue 15): a recipe with `model.lora` is planned as full fine-tuning, LoRA
and QLoRA; each candidate says its method, and QLoRA's memory is LoRA's simulation with the frozen block Linear
weights at NF4 bytes (docs/planner.md, "Fine-tuning methods"). A tiny Llama, so the file runs in seconds."""
from __future__ import annotations

import json
import math

import pytest
import torch
from rich.console import Console

import trainforge
from trainforge.cli import main
from trainforge.data import build_data
from trainforge.hardware.catalog import load_catalog
from trainforge.models import build_model
from trainforge.models.quantize_base import base_bytes_per_param
from trainforge.planning.plan import method_planners, plan
from trainforge.planning.render import render_plan
from trainforge.planning.roofline import dequantize_time_s

TINY_LLAMA = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
R = 8
RECIPE = [
    "name=tiny-llama", "data.source=synthetic_text", "data.args={task: lm, num_samples: 64, seq_len: 64, vocab_size: 256}",
    "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none",
    "model.name=hf", f"model.args={{pretrained: false, config: {TINY_LLAMA}}}",
    "train.global_batch_size=8", "train.micro_batch_size=8", "train.precision=bf16", "train.max_steps=10",
    "train.early_stopping=null",
]
LORA = f"model.lora={{r: {R}, alpha: 16, dropout: 0.0, target_modules: all-linear}}"
GPU = "h100-sxm"


@pytest.fixture(scope="module")
def lora_plan():
    cfg = trainforge.load_config(None, [*RECIPE, LORA])
    return cfg, plan(cfg, gpus=[GPU], num_gpus=[1], calibration={})


def by_method(result) -> dict:
    return {c.method: c for c in result.candidates}


def linear_shapes() -> list[tuple[int, int]]:
    """(in, out) of each Linear of one Llama block, from the config: q, k, v, o, gate, up, down."""
    d, ff, kv = TINY_LLAMA["hidden_size"], TINY_LLAMA["intermediate_size"], TINY_LLAMA["num_key_value_heads"]
    kv_width = kv * d // TINY_LLAMA["num_attention_heads"]
    return [(d, d), (d, kv_width), (d, kv_width), (d, d), (d, ff), (d, ff), (ff, d)]


def test_a_lora_recipe_is_planned_as_full_lora_and_qlora_side_by_side(lora_plan):
    cfg, result = lora_plan
    doc = json.loads(json.dumps(result.to_json()))
    assert sorted(row["method"] for row in doc["candidates"]) == ["full", "lora", "qlora"]
    assert result.simulation.peak_bytes == result.methods["lora"].peak_bytes  # the recipe's own method
    rows = by_method(result)
    assert all(c.fits and c.gpu == GPU and c.strategy == "none" and c.micro_batch_size == 8 for c in rows.values())
    assert rows["qlora"].peak_bytes_per_gpu < rows["lora"].peak_bytes_per_gpu < rows["full"].peak_bytes_per_gpu
    # AdamW: two fp32 moments per trained weight (+ a step counter per tensor): every weight, or the adapters only
    info = build_data(cfg.data, seed=0).info
    with torch.device("meta"):
        model, _ = build_model(trainforge.load_config(None, RECIPE).model, info)
    weights = sum(p.numel() for p in model.parameters())
    adapters = TINY_LLAMA["num_hidden_layers"] * sum(R * (i + o) for i, o in linear_shapes())
    states = {m: s.breakdown["optimizer_state"] for m, s in result.methods.items()}
    assert states["full"] == pytest.approx(2 * 4 * weights, rel=0.002)
    assert states["lora"] == states["qlora"] == pytest.approx(2 * 4 * adapters, rel=0.002)
    assert all(s.breakdown["gradients"] == 0 for s in result.methods.values())  # freed by zero_grad at the peak
    # full fine-tuning runs the weight gradients of every matmul, LoRA only the adapters'
    assert result.methods["full"].hardware_flops_per_step > result.methods["lora"].hardware_flops_per_step
    # the recommendation chooses among all methods; the console table names them
    assert result.recommendation.recommended in rows.values()
    assert doc["recommendation"]["recommended"]["method"] == result.recommendation.recommended.method
    console = Console(width=200, record=True)
    for renderable in render_plan(result):
        console.print(renderable)
    text = console.export_text()
    assert "method" in text and "qlora" in text and "fine-tuning methods" in text


def test_qlora_is_lora_with_the_frozen_block_linear_weights_at_nf4_bytes(lora_plan):
    cfg, result = lora_plan
    # counted here from the config: every Linear of every block is frozen under LoRA (the adapters train)
    elements = TINY_LLAMA["num_hidden_layers"] * sum(i * o for i, o in linear_shapes())
    nf4 = base_bytes_per_param("nf4")
    assert 0.5 < nf4 < 0.57  # 4 bits + block constants
    saved = elements * (4 - nf4)  # fp32: the base as the trainer holds it (bf16 autocast computes in 16 bits)
    one_layer = max(i * o for i, o in linear_shapes()) * 2  # one dequantized weight alive, bf16
    lora, qlora = result.methods["lora"], result.methods["qlora"]
    assert lora.breakdown["parameters"] - qlora.breakdown["parameters"] == pytest.approx(saved, abs=1)
    assert qlora.breakdown["activations"] == lora.breakdown["activations"]
    rows = by_method(result)
    assert (rows["lora"].simulated_peak_bytes_per_gpu - rows["qlora"].simulated_peak_bytes_per_gpu
            == pytest.approx(saved - one_layer, abs=1))
    # time: lora's plus reading the packed weights and writing them dequantized, forward and backward
    bandwidth = load_catalog().get(GPU).memory_bandwidth_bytes_per_s
    assert rows["qlora"].step_time_s - rows["lora"].step_time_s == pytest.approx(
        2 * elements * (nf4 + 2) / bandwidth, rel=1e-6)
    assert dequantize_time_s(elements, nf4, 2, 3, bandwidth) == pytest.approx(3 * elements * (nf4 + 2) / bandwidth)
    # the correction's weights are what `frozen_block_linear_weights` finds on the PEFT-wrapped model
    lora_planner = method_planners(cfg)[1]
    assert lora_planner.facts.block_linear == (elements, 4 * elements, max(i * o for i, o in linear_shapes()))


def test_a_recipe_without_lora_is_planned_as_full_fine_tuning_only(capsys):
    with pytest.raises(SystemExit) as code:
        main(["plan", *RECIPE, "--gpu", GPU, "--num-gpus", "1,2", "--json"])
    assert code.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert [row["method"] for row in doc["candidates"]] == ["full", "full"]
    assert "methods" not in doc and doc["recommendation"]["recommended"]["method"] == "full"


def test_a_qlora_recipe_shows_its_full_and_lora_alternatives():
    cfg = trainforge.load_config(None, [*RECIPE, LORA, "model.quantize_base=nf4"])
    full, lora, qlora = method_planners(cfg)  # no simulation yet: they run when candidates need them
    assert (full.method, lora.method, qlora.method) == ("full", "lora", "qlora")
    assert qlora.cfg is cfg and qlora.unquantized is lora and lora.cfg.model.quantize_base == "none"
    assert full.cfg.model.lora is None
    assert qlora.facts.frozen_bytes == lora.facts.frozen_bytes - qlora.quantization.saved_bytes
    assert math.isclose(qlora.quantization.bytes_per_param, base_bytes_per_param("nf4"))
