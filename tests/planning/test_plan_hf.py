"""`trainforge plan` of pretrained families: an 8B Hugging Face Llama over the whole catalog in under 2 minutes,
a timm ViT on fake tensors without its weights (HF_HUB_OFFLINE=1: tests/conftest.py)."""
from __future__ import annotations

import json
import time

import pytest
import torch

import trainforge
from trainforge.cli import main
from trainforge.data import build_data
from trainforge.hardware.catalog import load_catalog
from trainforge.models import build_model
from trainforge.planning.flops import transformer_flops_per_token
from trainforge.planning.plan import DEFAULT_NUM_GPUS, plan

LLAMA_8B = dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)


def llama_recipe(name: str, config: dict, *, seq: int, num_samples: int, global_batch: int, steps: int) -> list[str]:
    """An hf Llama from its config alone (no weights) on synthetic token windows of `seq` tokens."""
    vocab = config["vocab_size"]
    return [f"name={name}", "data.source=synthetic_text",
            f"data.args={{task: lm, num_samples: {num_samples}, seq_len: {seq}, vocab_size: {vocab}}}",
            "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none",
            "model.name=hf", f"model.args={{pretrained: false, config: {config}}}",
            f"train.global_batch_size={global_batch}", "train.micro_batch_size=1", "train.precision=bf16",
            f"train.max_steps={steps}", "train.early_stopping=null"]


LLAMA_8B_RECIPE = llama_recipe("llama8b", LLAMA_8B, seq=8192, num_samples=4096, global_batch=64, steps=1000)
PLAN_BUDGET_S = 120  # issue 14: the whole catalog at 1, 2, 4 and 8 GPUs on a 2-core machine
# The 2-core machines differ in speed from day to day (the same code planned the 8B model in 78-82 s on
# 2026-12-02 and in 165 s on 2026-12-03): the budget is for a machine of the reference speed, and scales by how
# much slower this one runs a small plan of the same kind (a 4-layer Llama on one GPU type). Reference: that plan
# took 2.9-3.1 s on 2026-12-03, when the 8B plan of the same (old) code took 165 s against 80 s: 1.45 s at the
# speed the budget was set at.
CALIBRATION_REFERENCE_S = 1.45
# Both the plan and the calibration are timed in this process's CPU seconds: the planner runs fake tensors on one
# thread, so on a machine to itself its CPU time is its wall time, and beside other tests (the suite's parallel phase)
# the cores they take do not count against it.
SMALL_LLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048)
SMALL_RECIPE = llama_recipe("calibration", SMALL_LLAMA, seq=1024, num_samples=256, global_batch=8, steps=10)


def machine_slowdown() -> float:
    """How much slower than the reference this machine plans (the fastest of 3 small plans; never below 1)."""
    cfg = trainforge.load_config(None, SMALL_RECIPE)
    plan(cfg, gpus=["h100-sxm"], num_gpus=[1])  # warm-up: imports and first-call caches
    times = []
    for _ in range(3):
        start_s = time.process_time()
        plan(cfg, gpus=["h100-sxm"], num_gpus=[1])
        times.append(time.process_time() - start_s)
    return max(1.0, min(times) / CALIBRATION_REFERENCE_S)

VIT_RECIPE = [
    "data.source=synthetic_images", "data.args={num_samples: 256, image_size: 224, channels: 3, num_classes: 10}",
    "data.normalize=none", "model.name=timm", "model.args={arch: vit_tiny_patch16_224, pretrained: true}",
    "train.global_batch_size=64", "train.micro_batch_size=64", "train.max_steps=100", "train.precision=auto",
]


@pytest.fixture(scope="module")
def llama_8b_plan():
    cfg = trainforge.load_config(None, LLAMA_8B_RECIPE)
    start_s = time.process_time()
    result = plan(cfg)  # every GPU of the catalog at the default counts
    return result, time.process_time() - start_s


@pytest.mark.slow  # a timing bar in CPU seconds (see CALIBRATION_REFERENCE_S): it holds beside other tests
def test_an_8b_llama_is_planned_over_the_whole_catalog_in_under_2_minutes(llama_8b_plan):
    result, elapsed_s = llama_8b_plan
    slowdown = machine_slowdown()
    print(f"8B plan {elapsed_s:.0f} s; this machine plans {slowdown:.2f}x slower than the reference")
    assert elapsed_s < PLAN_BUDGET_S * slowdown, (f"{elapsed_s:.0f} s on a machine {slowdown:.2f}x slower than the "
                                                 "reference (docs/planner.md: 78-82 s with one core free)")
    assert len(result.candidates) == len(load_catalog().names()) * len(DEFAULT_NUM_GPUS)
    assert result.simulation.param_count == 8_030_261_248
    rows = {(c.gpu, c.num_gpus): c for c in result.candidates}
    # 16 bytes of state per parameter (fp32 weights, gradients, two AdamW moments): 128 GB before any activation
    assert not any(c.fits for c in result.candidates if c.memory_bytes and c.memory_bytes <= 48e9 and c.num_gpus < 8)
    assert "even at micro-batch 1" in rows[("rtx-4090", 8)].reason
    h100 = rows[("h100-sxm", 8)]
    assert h100.fits and h100.strategy == "fsdp" and h100.activation_checkpointing
    assert rows[("b200", 1)].fits and rows[("b200", 1)].activation_checkpointing  # 180 GB: alone, recomputing
    # one simulation per distinct setup and micro-batch, shared by all 13 GPU types
    assert result.simulation.simulations_run <= 15


def test_a_timm_vit_is_planned_on_fake_tensors_without_reading_its_weights(monkeypatch, capsys):
    import timm

    def no_weights(*args, **kwargs):
        raise AssertionError("the planner read pretrained weights")

    monkeypatch.setattr(timm.models._builder, "load_pretrained", no_weights)
    with pytest.raises(SystemExit) as code:
        main(["plan", "resnet50_synthetic", *VIT_RECIPE, "--gpu", "rtx-4090", "--num-gpus", "1,2", "--json"])
    assert code.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert all(row["fits"] for row in doc["candidates"])
    cfg = trainforge.load_config("resnet50_synthetic", VIT_RECIPE)
    with torch.device("meta"):
        vit, _ = build_model(cfg.model, build_data(cfg.data, seed=0).info)
    params = sum(p.numel() for p in vit.parameters())
    assert doc["simulation"]["param_count"] == params == 5_526_346
    # a ViT is a transformer over 196 patches + the class token: the PaLM formula with N the weights of the
    # blocks and the head (the patch embedding runs once per patch, its input needs no gradient: 4 of its 6)
    blocks = params - sum(p.numel() for p in (vit.cls_token, vit.pos_embed, *vit.patch_embed.parameters()))
    patch = 192 * 3 * 16 * 16
    per_image = 197 * transformer_flops_per_token(blocks, 12, 3, 64, 197) + 196 * 4 * patch
    assert doc["simulation"]["model_flops_per_step"] / 64 == pytest.approx(per_image, rel=0.03)
