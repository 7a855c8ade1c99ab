"""`make gpu-check` (benchmarks/gpu_check.py) without a GPU: every part runs on the CPU at tiny sizes through the
same code a GPU runs, the document says nothing was measured, and its markdown renders."""
from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from trainforge.planning.calibration_store import HOME_ENV, load_calibration

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


@pytest.fixture(scope="module")
def plumbing(gpu_check, tmp_path_factory):
    saved = tmp_path_factory.mktemp("gpu_check") / "doc.json"
    home = tmp_path_factory.mktemp("home")
    stored = {"h100-sxm": {"time_factor": 1.25}}  # the user's own calibration
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HOME_ENV, str(home))
        (home / "calibration.json").write_text(json.dumps(stored))
        rc = gpu_check.main(["--plumbing", "--save", str(saved), "--budget-s", "900"])
        assert load_calibration() == stored  # calibrated into a temporary home: neither read nor overwritten
    return rc, saved, json.loads(saved.read_text())


def test_plumbing_mode_runs_every_part_and_says_nothing_was_measured(gpu_check, plumbing, tmp_path):
    rc, _, doc = plumbing
    assert rc == 0 and doc["errors"] == [] and doc["skipped"] == []
    assert doc["mode"] == "plumbing" and doc["measured"] is False and doc["message"] == "no CUDA GPU: nothing measured"
    assert doc["environment"]["catalog_name"] == "cpu" and doc["ratio"] is None  # no max_memory_reserved on a CPU

    rows = {r["case"]: r for r in doc["planner"]}
    assert list(rows) == [c.name for c in gpu_check.planner_cases(gpu_check.CPU_SIZES)]
    for r in rows.values():
        assert r["predicted_peak_bytes"] > 0 and r["measured_step_s"] > 0 and r["measured_reserved_bytes"] is None
        assert math.isclose(r["time_ratio"], r["predicted_step_s"] / r["measured_step_s"])
    # the prediction is made for the setup that ran: checkpointing lowers the simulated peak at the same micro-batch
    for micro in gpu_check.CPU_SIZES.gpt2_micros:
        plain, ckpt = rows[f"gpt2_small bf16 b{micro}"], rows[f"gpt2_small bf16 b{micro} +ckpt"]
        assert ckpt["activation_checkpointing"] and not plain["activation_checkpointing"]
        assert ckpt["simulated_peak_bytes"] < plain["simulated_peak_bytes"]
    assert rows["resnet50 bf16 channels_last b4"]["channels_last"] and rows["gpt2_small bf16 b2"]["precision"] == "bf16"

    gpt2 = doc["gpt2_throughput"]
    for label in ("eager", "compile"):
        t = gpt2[label]
        assert t["tokens_per_s"] == pytest.approx(t["samples_per_s"] * gpt2["seq_len"]) and 0 < t["mfu"] < 1
    assert gpt2["compile_speedup"] == pytest.approx(gpt2["eager"]["step_s"] / gpt2["compile"]["step_s"])

    # after --calibrate the stored time factor scales every prediction
    cal = doc["planner_calibrated"]
    assert cal["calibrated_on"] == "gpt2_small bf16 b2" and cal["time_factor"] > 0
    for before, after in zip(doc["planner"], cal["rows"]):
        assert after["predicted_step_s"] == pytest.approx(before["predicted_step_s"] * cal["time_factor"], rel=1e-6)
        assert after["measured_step_s"] == before["measured_step_s"]

    r50 = doc["resnet50_throughput"]
    assert r50["channels_last"]["images_per_s"] > 0 and r50["nchw"]["images_per_s"] > 0
    lora = doc["lora"]
    assert lora["activation_checkpointing"] and lora["parameters"] > 0 and lora["predicted_peak_bytes"] > 0
    assert [(r["batch"], r["tokens"]) for r in doc["int8"]["rows"]] == list(gpu_check.CPU_SIZES.int8_shapes)
    assert all(r["weight_only_speedup"] > 0 and r["dynamic_speedup"] > 0 for r in doc["int8"]["rows"])


def test_the_markdown_section_renders_a_saved_document(gpu_check, plumbing, capsys):
    _, saved, doc = plumbing
    capsys.readouterr()
    assert gpu_check.main(["--from", str(saved), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert f"commit `{doc['environment']['commit']}`" in text and "no CUDA GPU: nothing measured" in text
    for heading in ("**Planner truth**", "**After `--calibrate`**", "**GPT-2 small**", "**ResNet-50**", "**LoRA**",
                    "**torchao int8**"):
        assert heading in text
    assert text.count("| gpt2_small bf16 b4 |") == 2  # before and after calibration


def test_parts_beyond_the_budget_are_skipped_and_reported_not_failed(gpu_check, capsys):
    assert gpu_check.main(["--plumbing", "--json", "--budget-s", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    skipped = [s["what"] for s in doc["skipped"]]
    assert doc["planner"] == [] and doc["errors"] == [] and doc["ratio"] is None
    assert len(skipped) == len(gpu_check.planner_cases(gpu_check.CPU_SIZES)) + 5, skipped
    assert any(s.startswith("lora") for s in skipped) and any(s.startswith("int8") for s in skipped)


def test_a_part_that_fails_is_reported_and_the_check_goes_on(gpu_check):
    check = gpu_check.Check(budget_s=60, gpu=False)
    with check.part("broken"):
        raise RuntimeError("no kernel image for this GPU")
    with check.part("fine"):
        pass
    assert check.doc["errors"] == [{"what": "broken", "error": "RuntimeError: no kernel image for this GPU"}]


def test_a_saved_document_that_is_not_json_is_one_line_and_exit_2(gpu_check, tmp_path, capsys):
    bad = tmp_path / "doc.json"
    bad.write_text("{not json")
    assert gpu_check.main(["--from", str(bad), "--markdown"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --from {bad}") and "\n" not in err


def test_the_gpu_sizes_are_valid_recipe_overrides(gpu_check, tmp_path):
    """The GPU's workloads cannot run here, but a typo in their overrides would cost a lent GPU's minutes."""
    import trainforge

    sizes = gpu_check.GPU_SIZES
    for case in gpu_check.planner_cases(sizes):
        cfg = trainforge.load_config(case.recipe, gpu_check.short(case.overrides))
        assert cfg.train.micro_batch_size == cfg.train.global_batch_size or case.recipe == "digits_cnn"
    gpt2 = trainforge.load_config("gpt2_small_synthetic", gpu_check.short([*sizes.gpt2, "train.compile=true"]))
    assert gpt2.model.args["n_layer"] == 12 and gpt2.data.args["seq_len"] == 1024 and gpt2.train.compile
    lora = trainforge.load_config("llm_lora_sft", gpu_check.short(
        [f"model.args.pretrained={tmp_path / 'model'}", f"data.path={tmp_path / 'chats.jsonl'}", *sizes.lora]))
    assert lora.model.lora is not None and lora.data.args["seq_len"] == 1024
    assert sum(p.numel() for p in gpu_check._meta_llm(sizes.llm_shape).parameters()) == pytest.approx(494e6, rel=0.01)


def test_parts_and_cases_choose_what_runs_and_each_part_is_saved_as_it_ends(gpu_check, tmp_path, capsys):
    """A lent GPU's minutes are few: `--parts`/`--cases` run only what is asked, and `--save` is rewritten after
    every part, so a command killed at its time limit keeps what it measured (marked incomplete until the end)."""
    saved = tmp_path / "doc.json"
    seen: list[tuple[bool, int]] = []
    real_saved = gpu_check.Check.saved

    def spy(check):
        real_saved(check)
        doc = json.loads(saved.read_text())
        seen.append((doc["complete"], len(doc["planner"])))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu_check.Check, "saved", spy)
        assert gpu_check.main(["--plumbing", "--parts", "planner", "--cases", "gpt2_small bf16 b2",
                               "--save", str(saved)]) == 0
    doc = json.loads(saved.read_text())
    assert [r["case"] for r in doc["planner"]] == ["gpt2_small bf16 b2", "gpt2_small bf16 b2 +ckpt"]
    assert seen == [(False, 1), (False, 2), (True, 2)]  # after each case, then once complete
    skipped = {s["what"] for s in doc["skipped"]}
    assert {"throughput", "calibrate", "resnet", "lora", "int8"} <= skipped and "planner: digits_cnn" in skipped
    capsys.readouterr()
    doc["complete"] = False
    saved.write_text(json.dumps(doc))
    assert gpu_check.main(["--from", str(saved), "--markdown"]) == 0
    text = capsys.readouterr().out
    assert "**Incomplete:**" in text and "Parts run: planner (planner cases matching 'gpt2_small bf16 b2')" in text


def test_an_unknown_part_is_one_line_and_exit_2(gpu_check, capsys):
    assert gpu_check.main(["--parts", "planner,lorra"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --parts: unknown lorra") and "\n" not in err


def test_a_slow_variant_is_timed_fewer_times_not_for_ever(gpu_check):
    import torch

    calls = []

    class Slow(torch.nn.Module):
        def forward(self, x):
            calls.append(1)
            return x

    t = gpu_check.forward_time_s(Slow(), torch.zeros(1), repeats=1000, device=torch.device("cpu"), limit_s=0.0)
    assert t >= 0 and len(calls) == 3  # two warm-ups, then one timed call once the limit is spent
