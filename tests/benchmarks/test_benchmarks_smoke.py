"""The benchmarks run and report sane figures (the measured ones live in docs/benchmarks.md)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "loop_overhead.py"


def test_benchmark_smoke(capsys):
    spec = importlib.util.spec_from_file_location("loop_overhead", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--repeats", "1", "--steps", "20", "--channels", "4,8,16", "--batch-size", "8", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ratio"] > 0
    assert 0.2 < doc["ratio"] < 5  # same model, same data: the two loops are within a small factor


def test_planner_accuracy_benchmark_memory_rows_match():
    spec = importlib.util.spec_from_file_location("planner_accuracy", BENCH.parent / "planner_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.memory_rows()
    assert len(rows) == len(module.MEMORY_CASES)
    assert all(abs(r["ratio"] - 1) <= 0.05 for r in rows), rows


def test_finetune_vs_hf_benchmark_trains_the_same_thing_on_both_sides(capsys):
    """A few steps of trainforge and transformers.Trainer on the same saved tiny BERT, data, order and settings:
    the two per-step loss curves coincide (they would part at the first step with another order, other initial
    weights, other dropout masks, and soon after with another LR or weight decay)."""
    spec = importlib.util.spec_from_file_location("finetune_vs_hf", BENCH.parent / "finetune_vs_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--repeats", "1", "--steps", "12", "--skip", "2", "--batch-size", "8", "--seq-len", "32",
                      "--lr", "3e-3", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"ratio", "step_s", "max_loss_diff", "steps", "settings", "loss", "checks"} <= doc.keys()
    assert set(doc["step_s"]) == {"trainforge", "hf"} and all(t > 0 for t in doc["step_s"].values())
    assert doc["steps"] == 12 and doc["settings"]["batch_size"] == 8 and doc["timed_steps_per_side"] == 9
    assert 0.2 < doc["ratio"] < 5
    assert doc["checks"]["same_initial_weights"] and doc["checks"]["lr_schedule_max_abs_diff"] == 0
    assert doc["max_loss_diff"] < 1e-4, doc["max_loss_diff"]
    loss = doc["loss"]
    assert abs(loss["trainforge_last_mean"] - loss["hf_last_mean"]) < 1e-4
    assert loss["trainforge_last_mean"] != loss["trainforge_first"]  # it trained: the curves are not flat


def test_lora_vs_peft_benchmark_trains_the_same_adapters_on_both_sides(capsys):
    """A few lockstep steps of trainforge's model.lora and PEFT + transformers.Trainer on the same saved tiny Llama,
    windows, order, initial adapters and optimizer: the per-step loss curves coincide. Without the memory runs
    (--mem-steps 0: they would triple the time; the full run reports them)."""
    spec = importlib.util.spec_from_file_location("lora_vs_peft", BENCH.parent / "lora_vs_peft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--repeats", "1", "--steps", "8", "--skip", "2", "--batch-size", "4", "--block-size", "32",
                      "--lr", "1e-2", "--mem-steps", "0", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"ratio", "step_s", "max_loss_diff", "memory_ratio", "memory", "checks", "loss"} <= doc.keys()
    assert set(doc["step_s"]) == {"trainforge", "hf"} and all(t > 0 for t in doc["step_s"].values())
    assert doc["timed_steps_per_side"] == 5 and 0.2 < doc["ratio"] < 5
    assert doc["checks"]["same_initial_weights"] and doc["checks"]["lr_schedule_max_abs_diff"] == 0
    assert doc["max_loss_diff"] < 1e-5, doc["max_loss_diff"]
    assert doc["loss"]["trainforge_last_mean"] != doc["loss"]["trainforge_first"]  # the adapters trained
    assert doc["memory"] is None and doc["memory_ratio"] is None


def test_detection_vs_torchvision_benchmark_trains_the_same_detector_on_both_sides(capsys):
    """A few lockstep steps of trainforge and torchvision's reference loop on the same Faster R-CNN, files, order
    and generator state: the per-step loss curves are the same to the last bit (they part at the first step with
    another order, other weights, or a proposal sampled from another RNG state)."""
    spec = importlib.util.spec_from_file_location("detection_vs_torchvision", BENCH.parent / "detection_vs_torchvision.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--repeats", "2", "--steps", "6", "--skip", "1", "--batch-size", "4", "--images", "60",
                      "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"ratio", "by_clock", "max_loss_diff", "repeats", "loss_first"} <= doc.keys()
    assert [r["first"] for r in doc["repeats"]] == ["trainforge", "torchvision"]
    assert doc["settings"]["interleave"] == "step" and 0.2 < doc["ratio"] < 5
    assert doc["max_loss_diff"] == 0.0
    assert doc["loss_first"]["trainforge"] == doc["loss_first"]["torchvision"]
