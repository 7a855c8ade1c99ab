"""The planner end to end: contract of `plan --json`, fits and strategies, cost arithmetic, speed,
auto micro-batch in training, calibration."""
from __future__ import annotations

import json
import time

import pytest

import trainforge
from trainforge.cli import main
from trainforge.errors import UserError
from trainforge.planning.memory import SAFETY_MARGIN
from trainforge.planning.plan import plan as typed_plan


def plan(cfg, **kwargs) -> dict:
    """These tests check the `plan --json` document; tests/planning/test_plan_result.py checks the typed Plan."""
    return typed_plan(cfg, **kwargs).to_json()

SIM_KEYS = {"peak_bytes", "breakdown", "model_flops_per_step", "hardware_flops_per_step", "samples_per_step",
            "tokens_per_step"}
CANDIDATE_KEYS = {"gpu", "num_gpus", "strategy", "micro_batch_size", "accumulation", "fits", "peak_bytes_per_gpu",
                  "step_time_s", "total_time_s", "cost_usd", "energy_kwh"}

GPT_7B = [
    "name=gpt7b", "data.source=synthetic_text", "data.args={task: lm, num_samples: 4096, seq_len: 2048, vocab_size: 32000}",
    "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none",
    "model.name=gpt", "model.args={n_layer: 32, n_head: 32, n_embd: 4096, vocab_size: 32000, block_size: 2048}",
    "train.global_batch_size=64", "train.micro_batch_size=1", "train.precision=bf16", "train.max_steps=1000",
    "train.early_stopping=null",
]


@pytest.fixture(scope="module")
def digits_plan():
    cfg = trainforge.load_config("digits_cnn")
    return plan(cfg, gpus=["h100-sxm", "rtx-4090", "t4"], num_gpus=[1, 2, 8], budget_usd=1.0, deadline_h=1.0)


def test_plan_json_contract(digits_plan):
    assert SIM_KEYS <= set(digits_plan["simulation"])
    assert set(digits_plan["simulation"]["breakdown"]) >= {"parameters", "gradients", "optimizer_state", "activations"}
    assert len(digits_plan["candidates"]) == 9
    for row in digits_plan["candidates"]:
        assert CANDIDATE_KEYS <= set(row), set(row) ^ CANDIDATE_KEYS


def test_cost_and_energy_arithmetic(digits_plan):
    for row in digits_plan["candidates"]:
        hours = row["total_time_s"] / 3600
        assert row["total_time_s"] == pytest.approx(row["step_time_s"] * digits_plan["steps"])
        assert row["cost_usd"] == pytest.approx(hours * row["num_gpus"] * row["price_usd_per_hour"])
        assert row["energy_kwh"] > 0
        assert row["micro_batch_size"] * row["accumulation"] * row["num_gpus"] == digits_plan["global_batch_size"]
        assert row["peak_bytes_per_gpu"] <= row["memory_bytes"] * SAFETY_MARGIN


def test_t4_plans_fp16_and_multi_gpu_adds_communication_buffers(digits_plan):
    rows = {(r["gpu"], r["num_gpus"]): r for r in digits_plan["candidates"]}
    assert rows[("t4", 1)]["precision"] == "fp16" and rows[("h100-sxm", 1)]["precision"] == "bf16"
    assert rows[("h100-sxm", 1)]["strategy"] == "none" and rows[("h100-sxm", 2)]["strategy"] == "ddp"
    assert "nccl_buffers" in rows[("h100-sxm", 2)]["corrections_bytes"]
    assert "nccl_buffers" not in rows[("h100-sxm", 1)]["corrections_bytes"]


def test_recommendation_respects_budget_and_deadline(digits_plan):
    rec = digits_plan["recommendation"]
    assert rec["recommended"] == rec["cheapest"]
    cfg = trainforge.load_config("digits_cnn")
    tight = plan(cfg, gpus=["h100-sxm"], num_gpus=[1], budget_usd=1e-9)
    assert tight["recommendation"]["recommended"] is None
    assert tight["candidates"][0]["within_budget"] is False
    assert "budget" in tight["recommendation"]["reason"]


def test_simulations_are_shared_across_gpus(digits_plan):
    # 1 and 2 for the replica's lines, then the micro-batch each count takes (64, 32 and 8 of the global 64:
    # the recipe's own 64 among them), each simulated once for every GPU type
    assert digits_plan["simulation"]["simulations_run"] <= 5


def test_gpt2_small_fits_a_24gb_gpu_with_ddp():
    cfg = trainforge.load_config("gpt2_small_synthetic")
    result = plan(cfg, gpus=["rtx-4090"], num_gpus=[2])
    row = result["candidates"][0]
    assert row["fits"] and row["strategy"] == "ddp" and not row["activation_checkpointing"]
    assert row["micro_batch_size"] >= 1 and row["peak_bytes_per_gpu"] < 24e9


@pytest.mark.slow
def test_7b_gpt_fits_no_24gb_gpu_and_fits_8_h100_with_fsdp():
    cfg = trainforge.load_config(None, GPT_7B)
    result = plan(cfg, gpus=["rtx-4090", "l4", "rtx-3090", "h100-sxm"], num_gpus=[1, 8])
    rows = {(r["gpu"], r["num_gpus"]): r for r in result["candidates"]}
    for gpu in ("rtx-4090", "l4", "rtx-3090"):
        assert not rows[(gpu, 1)]["fits"], rows[(gpu, 1)]
        assert "even at micro-batch 1 with every strategy" in rows[(gpu, 1)]["reason"]
    h100 = rows[("h100-sxm", 8)]
    assert h100["fits"] and h100["strategy"] == "fsdp"
    assert result["simulation"]["param_count"] > 6.5e9


@pytest.mark.slow  # a timing bar in CPU seconds: the planner's one thread, on a machine to itself its wall time
def test_resnet50_over_10_gpus_and_4_counts_in_under_60_s():
    cfg = trainforge.load_config("resnet50_synthetic")
    gpus = ["a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s", "l4", "t4", "rtx-4090"]
    start = time.process_time()
    result = plan(cfg, gpus=gpus, num_gpus=[1, 2, 4, 8])
    elapsed_s = time.process_time() - start
    assert len(result["candidates"]) == 40 and all(r["fits"] for r in result["candidates"])
    assert elapsed_s < 60, elapsed_s


def test_plan_cli_prints_one_json_document(capsys):
    with pytest.raises(SystemExit) as code:
        main(["plan", "--gpu", "h100-sxm", "--num-gpus", "1,2", "--json"])
    assert code.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert {"simulation", "candidates", "recommendation"} <= set(doc)


def test_plan_cli_renders_tables(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--gpu", "rtx-4090", "--num-gpus", "1"])
    out = capsys.readouterr().out
    assert "candidates" in out and "rtx-4090" in out and "recommended" in out


@pytest.mark.parametrize("args,message", [
    (["--gpu", "a200"], "unknown"),
    (["--num-gpus", "one"], "--num-gpus"),
    (["--efficiency", "3"], "--efficiency"),
])
def test_plan_cli_bad_input(args, message, capsys):
    with pytest.raises(SystemExit) as code:
        main(["plan", *args])
    assert code.value.code == 2
    assert message in capsys.readouterr().err


def test_auto_micro_batch_picks_the_largest_that_fits_the_budget(tmp_path):
    from trainforge.data import build_data
    from trainforge.engine.env import DistEnv
    from trainforge.planning.memory import SimKey
    from trainforge.planning.plan import Planner
    from trainforge.training.setup import DataFacts, resolve
    import torch

    budget = 2_500_000
    cfg = trainforge.load_config(None, ["train.micro_batch_size=auto", f"train.memory_budget_bytes={budget}"])
    data = build_data(cfg.data, seed=0)
    setup = resolve(cfg, DistEnv(), torch.device("cpu"), DataFacts(data.info, len(data.train), convolutional=True))
    micro = setup.micro_batch_size
    assert 1 <= micro < 64 and setup.accumulation == 64 // micro
    assert setup.predicted_peak_bytes <= budget * SAFETY_MARGIN
    assert f"auto: {micro}" in setup.reasons["micro_batch_size"] and "train.memory_budget_bytes" in setup.notes[0]
    planner = Planner(cfg, info=data.info, steps=10)
    key = SimKey("none", 1, False, "fp32")
    assert planner.cache.get(key, micro).peak_bytes <= budget * SAFETY_MARGIN
    assert planner.cache.get(key, micro * 2).peak_bytes > budget * SAFETY_MARGIN
    result = trainforge.train(cfg, overrides=["train.max_steps=2", "log.progress=false"], run_dir=tmp_path / "run")
    assert result.micro_batch_size == micro == result.setup.micro_batch_size


def test_auto_micro_batch_with_no_room_is_a_user_error(tmp_path):
    cfg = trainforge.load_config(None, ["train.micro_batch_size=auto", "train.memory_budget_bytes=1000"])
    with pytest.raises(UserError, match="train.micro_batch_size: auto found no micro-batch that fits"):
        trainforge.train(cfg, run_dir=tmp_path / "run")


def test_calibration_on_cpu_is_stored_and_used(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as code:
        main(["plan", "--calibrate", "--json", "model.args={channels: [8, 16]}"])
    assert code.value.code in (0, None)
    entry = json.loads(capsys.readouterr().out)
    assert entry["device"] == "cpu" and entry["measured_step_time_s"] > 0
    assert entry["time_factor"] == pytest.approx(entry["measured_step_time_s"] / entry["predicted_step_time_s"])
    stored = json.loads((tmp_path / "calibration.json").read_text())
    assert stored["cpu"]["time_factor"] == pytest.approx(entry["time_factor"])
    # a later plan for this CPU predicts the measured step time
    cfg = trainforge.load_config(None, ["model.args={channels: [8, 16]}"])
    row = plan(cfg, gpus=["cpu"], num_gpus=[1])["candidates"][0]
    assert row["step_time_s"] == pytest.approx(entry["measured_step_time_s"], rel=0.02)
