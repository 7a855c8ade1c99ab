"""Tasks that are not shipped, registered by a module the run imports (tests/plugin_tasks.py), through every stage
the core runs without naming a task (issue 41, point 6): train, evaluate, SIGKILL mid-epoch and resume
bit-identical, two processes against one at twice the micro-batch, `plan`, and the planner's simulated peak against
a real step. fusion's inputs are a dict of named tensors; detection's targets are a list of dicts with a different
number of boxes per image, and its model returns a loss dict in training mode and detections in eval mode. The core
batches, moves, calls and plans both through the task alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainforge
from plugin_tasks import PATCH, WHOLE, Volume, detection_data, fusion_data, volume_data, volume_model
from test_crash_resume import assert_bit_identical, kill_and_resume, launch
from trainforge.cli import main
from trainforge.config import ModelConfig, OptimConfig
from trainforge.planning.simulate import measure_real_step, simulate_step

TESTS = str(Path(__file__).resolve().parents[1])  # where plugin_tasks.py is: the runs import it from here
COMMON = ["model.name=custom", "model.args={width: 16}", "optim.name=adamw", "optim.lr=0.003",
          "schedule.warmup_steps=0", "train.global_batch_size=16", "train.device=cpu", "train.early_stopping=null",
          "train.deterministic=true", "train.num_threads=1", "train.log_every_steps=1", "log.progress=false",
          "log.tensorboard=false", "log.report=false"]
TASK_RUNS = {name: ["data.source=custom", f"data.target=plugin_tasks:{name}_data",
                    f"model.target=plugin_tasks:{name}_model", *COMMON] for name in ("fusion", "detection", "volume")}
DATA = {"fusion": fusion_data, "detection": detection_data, "volume": volume_data}


def run_overrides(*extra: str, micro: int = 8, task: str = "fusion") -> list[str]:
    return [*TASK_RUNS[task], f"train.micro_batch_size={micro}", *extra]


def cli(run_dir: Path, *overrides: str, nproc: int = 1) -> list[str]:
    cmd = [sys.executable, "-m", "trainforge", "train", *overrides, "--run-dir", str(run_dir)]
    return cmd + (["--nproc-per-node", str(nproc)] if nproc > 1 else [])


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p))


def train_losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def test_a_fusion_run_trains_on_dict_batches_and_evaluates_through_its_task(tmp_path, capsys):
    run = tmp_path / "run"
    result = trainforge.train(trainforge.load_config(None, run_overrides("train.epochs=4")), run_dir=run)
    assert result.status == "completed"
    ev = json.loads((run / "eval.json").read_text())
    # the label needs both inputs (either alone is right 3 times in 4): the run learned from the fused batch
    assert ev["accuracy"] > 0.75 and ev["class_names"] == ["low", "high"] and "confusion_matrix" in ev
    stored = json.loads((run / "final" / "model.json").read_text())["data_info"]
    assert stored["task"] == "fusion"  # and each input by name, as the data described it
    assert [(i["name"], i["shape"], i["modality"]) for i in stored["inputs"]] == [
        ("image", [1, 8, 8], "image"), ("features", [6], "tabular")]
    with pytest.raises(SystemExit) as code:
        main(["eval", str(run), "--split", "test", "--json"])
    assert code.value.code in (0, None)
    again = json.loads(capsys.readouterr().out)
    assert again["accuracy"] == ev["accuracy"] and again["loss"] == pytest.approx(ev["loss"], rel=1e-6)


def test_a_detection_run_trains_on_list_of_dict_targets_and_evaluates_its_detections(tmp_path, capsys):
    run = tmp_path / "run"
    # early stopping with no metric named: the task's default (recall_50), maximized
    overrides = run_overrides("train.epochs=6", "train.early_stopping={patience: 100}", "log.report=true",
                              task="detection")
    assert trainforge.train(trainforge.load_config(None, overrides), run_dir=run).status == "completed"
    last = sorted((run / "checkpoints").glob("step-*"))[-1]
    best = torch.load(last / "state.pt", weights_only=False)["early_stop"]["best"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["split"] == "val"]
    assert val and all("loss" not in r for r in val)  # in eval mode the model gives detections, not losses
    step = int(last.name.removeprefix("step-"))
    assert best == max(r["recall_50"] for r in val if r["step"] <= step)
    ev = json.loads((run / "eval.json").read_text())
    assert "loss" not in ev and set(ev) >= {"recall_50", "precision_50"}
    assert "recall_50" in (run / "report.html").read_text()  # the report charts what the task reports
    untrained = _untrained_recall()
    assert ev["recall_50"] > untrained + 0.1, (ev, untrained)  # it learned where the boxes are
    with pytest.raises(SystemExit) as code:
        main(["eval", str(run), "--split", "test", "--json"])
    assert code.value.code in (0, None)
    assert json.loads(capsys.readouterr().out)["recall_50"] == ev["recall_50"]


def test_a_volume_run_trains_on_patches_and_evaluates_larger_volumes_through_a_sliding_window(tmp_path):
    run = tmp_path / "run"
    assert trainforge.train(trainforge.load_config(None, run_overrides("train.epochs=4", task="volume")),
                            run_dir=run).status == "completed"
    ev = json.loads((run / "eval.json").read_text())
    assert ev["dice"] > 0.8 and ev["loss"] < 0.3, ev  # the ball, voxel by voxel, in volumes it never trained on
    model, _ = volume_model(volume_data(8).info)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    volumes, labels = Volume().collate([volume_data(8).test[i] for i in range(2)])
    assert volumes.shape == (2, 1, WHOLE, WHOLE, WHOLE)
    with torch.no_grad():
        logits = Volume().forward(model.eval(), (volumes, labels))
    assert logits.shape == (2, 2, WHOLE, WHOLE, WHOLE)  # every voxel of the whole volume
    assert set(seen) == {(2, 1, PATCH, PATCH, PATCH)} and len(seen) == 27  # 3 overlapping windows a side


def _untrained_recall() -> float:
    from plugin_tasks import Detection, detection_model

    torch.manual_seed(0)
    model, _ = detection_model(detection_data(8).info)
    model.eval()
    data = detection_data(num_samples=8).test
    evaluation = Detection().evaluation(None)
    batch = Detection().collate([data[i] for i in range(len(data))])
    with torch.no_grad():
        evaluation.add_batch(Detection().forward(model, batch), batch)
    return evaluation.result(False)["recall_50"]


@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_the_planner_simulates_a_plugin_tasks_batch_within_15_percent_of_a_real_step(task):
    info = DATA[task](num_samples=8).info
    model = ModelConfig(name="custom", target=f"plugin_tasks:{task}_model")
    sim = simulate_step(model, OptimConfig(name="adamw"), info, micro_batch_size=32)
    real = measure_real_step(model, OptimConfig(name="adamw"), info, micro_batch_size=32)
    assert sim.peak_bytes == pytest.approx(real, rel=0.15)
    assert sim.model_flops_per_sample > 0


@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_micro_batch_auto_sizes_a_plugin_tasks_batch(task, tmp_path):
    """`micro_batch_size: auto` is the planner's answer from the task's example batch; the run then trains with it."""
    run = tmp_path / "run"
    cfg = trainforge.load_config(None, [*TASK_RUNS[task], "train.micro_batch_size=auto", "train.max_steps=4"])
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    ran = json.loads((run / "final" / "model.json").read_text())["ran"]
    assert 1 <= ran["micro_batch_size"] <= 16 and 16 % ran["micro_batch_size"] == 0


@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_plan_names_a_setup_for_a_plugin_task(task, tmp_path, capsys):
    recipe = tmp_path / f"{task}.yaml"
    recipe.write_text(f"name: {task}\n")
    with pytest.raises(SystemExit) as code:
        main(["plan", str(recipe), *run_overrides(task=task), "--json"])
    assert code.value.code in (0, None), capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert doc  # a plan was made from the task's example batch


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_a_plugin_task_run_sigkilled_mid_epoch_resumes_bit_identical(task, tmp_path):
    overrides = run_overrides("train.epochs=3", "train.checkpoint_every_steps=5", task=task)
    reference = tmp_path / "reference"
    assert trainforge.train(trainforge.load_config(None, overrides), run_dir=reference).status == "completed"
    run = tmp_path / "killed"
    # 32 steps an epoch, a checkpoint every 5: each kill lands somewhere in a step
    assert kill_and_resume(lambda: launch(run, overrides, env()), run, kills=3, seed=41, pause_s=0.2) >= 2
    assert_bit_identical(reference, run)
    assert json.loads((run / "eval.json").read_text()) == json.loads((reference / "eval.json").read_text())


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_two_processes_on_a_plugin_task_match_one_at_twice_the_micro_batch(task, tmp_path):
    trainforge.train(trainforge.load_config(None, run_overrides("train.max_steps=20", micro=8, task=task)),
                     run_dir=tmp_path / "one")
    two = subprocess.run(cli(tmp_path / "two", *run_overrides("train.max_steps=20", micro=4, task=task), nproc=2), env=env(),
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one, other = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(other) == 20
    assert max(abs(a - b) for a, b in zip(one, other)) < 1e-5
