"""Tasks that are not shipped, registered by a module the run imports (tests/plugin_tasks.py), through every stage
the core runs without naming a task (issue 41, point 6): train, evaluate, SIGKILL mid-epoch and resume
bit-identical, two processes against one at twice the micro-batch, `plan`, the planner's simulated peak against
a real step, ONNX export (`trainforge compress`) and `trainforge predict` from the exported file, in a process of
its own that imports the task's module only because --import names it. fusion's inputs are a dict of named tensors; detection's targets are a list of dicts with a different
number of boxes per image, and its model returns a loss dict in training mode and detections in eval mode. The core
batches, moves, calls and plans both through the task alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trainforge
from PIL import Image
from plugin_tasks import (BOX_CLASSES, BOX_COLOURS, PATCH, WHOLE, Detection, Fusion, Volume, detection_data, fusion_data,
                          volume_data, volume_model)
from test_crash_resume import assert_bit_identical, kill_and_resume, launch
from trainforge.cli import main
from trainforge.config import ModelConfig, OptimConfig
from trainforge.planning.simulate import measure_real_step, simulate_step
from trainforge.training.artifacts import load_trained

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

    # exported with both inputs by name; its test accuracy is the run's; predict serves .npz files of both inputs
    fp32 = exported(run, tmp_path, capsys, quantize="int8")
    assert fp32["accuracy"] == ev["accuracy"] and fp32["max_abs_diff"] < 1e-4
    samples = [fusion_data(num_samples=8).test[i] for i in range(5)]
    inputs, _ = Fusion().collate(samples)
    np.savez(tmp_path / "two.npz", image=inputs["image"][:2].numpy(), features=inputs["features"][:2].numpy())
    for i in range(2, 5):
        np.savez(tmp_path / f"{i}.npz", image=inputs["image"][i].numpy(), features=inputs["features"][i].numpy())
    # fp32 against the PyTorch model (compress may recommend int8 on a machine where it is faster)
    got = predicted(run, [tmp_path / "two.npz", *(tmp_path / f"{i}.npz" for i in range(2, 5))], "--variant", "fp32")
    model = load_trained(run).build_model().eval()
    with torch.no_grad():
        probs = model(inputs).softmax(-1)
    assert [p["input"] for p in got][:2] == [f"{tmp_path / 'two.npz'}[0]", f"{tmp_path / 'two.npz'}[1]"]
    assert [p["index"] for p in got] == probs.argmax(-1).tolist()
    np.testing.assert_allclose([p["probability"] for p in got], probs.max(-1).values.numpy(), rtol=1e-5)
    # one image is not what this model takes: one line saying what it does take
    refused = predict_cli(run, [tmp_path / "x.png"], "--import", "plugin_tasks")
    assert refused.returncode == 2
    assert "this model takes image (1x8x8 float32), features (6 float32)" in " ".join(refused.stderr.split())


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

    # exported as fixed-shape slots that predict filters as the model does in eval mode: the same detections
    fp32 = exported(run, tmp_path, capsys)
    assert fp32["recall_50"] == ev["recall_50"] and fp32["precision_50"] == ev["precision_50"]
    images, _ = Detection().collate([detection_data(num_samples=8).test[i] for i in range(6)])
    np.savez(tmp_path / "images.npz", input=images.numpy())
    got = predicted(run, [tmp_path / "images.npz"], "--images", str(tmp_path / "drawn"))
    model = load_trained(run).build_model().eval()
    with torch.no_grad():
        want = model(images)
    assert [p["labels"] for p in got] == [[BOX_CLASSES[i] for i in d["labels"]] for d in want]
    for p, d in zip(got, want):
        np.testing.assert_allclose(np.array(p["boxes"]).reshape(-1, 4), d["boxes"].numpy(), atol=0.006)
        np.testing.assert_allclose(p["scores"], d["scores"].numpy(), atol=1e-4)
        # --images: the image with each box drawn in its class's colour, on the box's edge
        picture = np.asarray(Image.open(p["image"]))
        assert picture.shape == (8 * images.shape[2], 8 * images.shape[3], 3)
        if p["labels"]:  # the box drawn last is on top at its corner
            (x1, y1, x2, y2), label = p["boxes"][-1], p["labels"][-1]
            assert tuple(picture[int(8 * min(y1, y2)) + 1, int(8 * min(x1, x2)) + 1]) == BOX_COLOURS[label]
    assert sum(bool(p["labels"]) for p in got) >= 1  # the drawing check above is not vacuous
    refused = predict_cli(run, [tmp_path / "images.npz"], "--import", "plugin_tasks", "--images", str(tmp_path / "drawn"))
    assert refused.returncode == 2 and "--images" in refused.stderr and "is not empty" in refused.stderr


def test_a_volume_run_trains_on_patches_and_evaluates_larger_volumes_through_a_sliding_window(tmp_path, capsys):
    run = tmp_path / "run"
    assert trainforge.train(trainforge.load_config(None, run_overrides("train.epochs=4", task="volume")),
                            run_dir=run).status == "completed"
    ev = json.loads((run / "eval.json").read_text())
    assert ev["dice"] > 0.8 and ev["loss"] < 0.3, ev  # the ball, voxel by voxel, in volumes it never trained on

    # exported as the patch model it trained as; compress and predict slide it over whole volumes as evaluation does
    fp32 = exported(run, tmp_path, capsys)
    assert fp32["dice"] == pytest.approx(ev["dice"], abs=1e-6) and fp32["loss"] == pytest.approx(ev["loss"], rel=1e-5)
    volumes, _ = Volume().collate([volume_data(8).test[i] for i in range(3)])
    np.save(tmp_path / "volumes.npy", volumes.numpy())
    got = predicted(run, [tmp_path / "volumes.npy"])
    trained = load_trained(run).build_model().eval()
    with torch.no_grad():
        classes = Volume().forward(trained, (volumes, None)).argmax(1)
    for p, c in zip(got, classes):
        assert p["shape"] == [WHOLE] * 3
        assert p["voxels"] == {"background": int((c == 0).sum()), "ball": int((c == 1).sum())}
    model, _ = volume_model(volume_data(8).info)
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(tuple(args[0].shape)))
    volumes, labels = Volume().collate([volume_data(8).test[i] for i in range(2)])
    assert volumes.shape == (2, 1, WHOLE, WHOLE, WHOLE)
    with torch.no_grad():
        logits = Volume().forward(model.eval(), (volumes, labels))
    assert logits.shape == (2, 2, WHOLE, WHOLE, WHOLE)  # every voxel of the whole volume
    assert set(seen) == {(2, 1, PATCH, PATCH, PATCH)} and len(seen) == 27  # 3 overlapping windows a side


def exported(run: Path, tmp_path: Path, capsys, quantize: str = "none") -> dict:
    """`trainforge compress RUN` (ONNX export, measured on the test split): the fp32 row of its table."""
    with pytest.raises(SystemExit) as code:
        main(["compress", str(run), "--quantize", quantize, "--bench-seconds", "0.02", "--out", str(onnx_dir(run)),
              "--json"])
    captured = capsys.readouterr()
    assert code.value.code in (0, None), captured.err
    doc = json.loads(captured.out)
    return next(v for v in doc["variants"] if v["name"] == "fp32")


def onnx_dir(run: Path) -> Path:
    return run.parent / "onnx"


def predict_cli(run: Path, inputs: list, *options: str) -> subprocess.CompletedProcess:
    """`trainforge predict` on the run's exported folder, in a fresh process (which imports no test module itself)."""
    cmd = [sys.executable, "-m", "trainforge", "predict", str(onnx_dir(run)), *map(str, inputs), *options]
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)


def predicted(run: Path, inputs: list, *options: str) -> list[dict]:
    """The predictions from the exported folder: refused until --import names the module that registers the task
    (an artifact's word imports nothing), then served."""
    plain = predict_cli(run, inputs)
    assert plain.returncode == 2 and "pass --import plugin_tasks" in " ".join(plain.stderr.split()), plain.stderr
    done = predict_cli(run, inputs, "--import", "plugin_tasks", "--json", *options)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["predictions"]


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
    """`micro_batch_size: auto` is the planner's answer from the task's example batch; the run then trains with it,
    its batches collated by the task in two loader worker processes."""
    run = tmp_path / "run"
    cfg = trainforge.load_config(None, [*TASK_RUNS[task], "train.micro_batch_size=auto", "train.max_steps=4",
                                        "data.num_workers=2"])
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    ran = json.loads((run / "final" / "model.json").read_text())["ran"]
    assert 1 <= ran["micro_batch_size"] <= 16 and 16 % ran["micro_batch_size"] == 0 and ran["num_workers"] == 2


@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_the_job_admission_sizes_a_plugin_tasks_job(task):
    """The queue's sizing (its pre-flight, then the planner's peak and `auto` pinned to what fits a slot) takes the
    task's batch as it takes any other. (The server itself runs no custom code, so this is the sizing a submission
    gets once its config is loaded.)"""
    from trainforge.jobs.admission import size_submission
    from trainforge.jobs.slots import Slot

    gib = 1 << 30
    cfg = trainforge.load_config(None, [*TASK_RUNS[task], "train.micro_batch_size=auto", "train.max_steps=8"])
    job = size_submission(cfg, 1, [Slot("cpu0", "cpu", "cpu", 2 * gib, 2 * gib)])
    assert 0 < job.memory_bytes < 2 * gib and job.total_steps == 8
    assert 1 <= job.micro_batch_size <= 16 and f"micro_batch_size: {job.micro_batch_size}" in job.config_yaml
    tiny = [Slot("cpu0", "cpu", "cpu", 1 << 16, 1 << 16)]  # 64 KiB: less than some of these models' weights
    fixed = trainforge.load_config(None, [*TASK_RUNS[task], "train.micro_batch_size=8", "train.max_steps=8"])
    for refused in (cfg, fixed):
        with pytest.raises(trainforge.UserError, match="but the largest slot holds|auto found no micro-batch that fits"):
            size_submission(refused, 1, tiny)


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
    overrides = run_overrides("train.epochs=2", "train.checkpoint_every_steps=5", task=task)
    reference = tmp_path / "reference"
    assert trainforge.train(trainforge.load_config(None, overrides), run_dir=reference).status == "completed"
    run = tmp_path / "killed"
    # 8 to 32 steps an epoch, a checkpoint every 5: each kill lands somewhere in a step, mid-epoch
    assert kill_and_resume(lambda: launch(run, overrides, env()), run, kills=2, seed=41, pause_s=0.2) >= 1
    assert_bit_identical(reference, run)
    assert json.loads((run / "eval.json").read_text()) == json.loads((reference / "eval.json").read_text())


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("task", sorted(TASK_RUNS))
def test_two_processes_on_a_plugin_task_match_one_at_twice_the_micro_batch(task, tmp_path):
    trainforge.train(trainforge.load_config(None, run_overrides("train.max_steps=12", micro=8, task=task)),
                     run_dir=tmp_path / "one")
    two = subprocess.run(cli(tmp_path / "two", *run_overrides("train.max_steps=12", micro=4, task=task), nproc=2), env=env(),
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one, other = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(other) == 12
    assert max(abs(a - b) for a, b in zip(one, other)) < 1e-5


def test_a_modality_a_plugin_module_registers_is_listed_normalized_augmented_and_trained(tmp_path, capsys):
    """Issue 51, point 4 and acceptance 5: plugin_tasks registers a `waveform` modality (C, T) after trainforge was
    imported. `trainforge tasks --import plugin_tasks` lists it (in a process of its own); the pipeline, which names
    no modality, fits normalization per channel through its channel_view, augments by its time reversal and warns
    of the settings it does not take; a run learns from it."""
    listed = subprocess.run([sys.executable, "-m", "trainforge", "tasks", "--import", "plugin_tasks"], env=env(),
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "waveform" in listed.stdout and "fusion" in listed.stdout, listed.stderr
    with pytest.raises(SystemExit) as code:
        main(["tasks", "--modalities", "--json"])
    assert code.value.code in (0, None)
    kinds = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert {"image", "text", "tabular", "volume", "multimodal", "waveform"} <= set(kinds)
    assert kinds["waveform"]["predict_reads"] == "arrays (.npz, .npy)" and "PNG" in kinds["image"]["predict_reads"]

    from trainforge.data import build_data

    overrides = ["data.source=custom", "data.target=plugin_tasks:waveform_data", "data.normalize=zscore",
                 "model.target=plugin_tasks:waveform_model", *COMMON, "train.micro_batch_size=16", "train.epochs=8",
                 "data.augment.hflip=0.5", "data.augment.vflip=0.5"]
    cfg = trainforge.load_config(None, overrides)
    with pytest.warns(UserWarning, match=r"data.augment.vflip ignored: a waveform takes data.augment.hflip"):
        bundle = build_data(cfg.data, seed=cfg.seed)
    stats = bundle.report["normalization"]
    assert stats["kind"] == "zscore" and len(stats["mean"]) == 2  # per channel, not per (channel, time) value
    assert abs(stats["mean"][1] - 100) < 2 and abs(stats["std"][1] - 10) < 2
    x, _ = bundle.val[0]
    assert x.shape == (2, 32) and abs(float(x[1].mean())) < 1.5  # channel 1 scaled as channel 1, over time
    plain, _ = bundle.train[0]
    drawn = [bundle.train[(epoch, 0)][0] for epoch in range(12)]
    assert any(torch.equal(d, plain) for d in drawn) and any(torch.equal(d, plain.flip(-1)) for d in drawn)

    run = tmp_path / "run"
    result = trainforge.train(cfg, run_dir=run)
    assert result.status == "completed"
    assert json.loads((run / "eval.json").read_text())["accuracy"] > 0.9
    assert json.loads((run / "final" / "model.json").read_text())["data_info"]["modality"] == "waveform"
