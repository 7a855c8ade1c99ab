"""Detection runs on square frames (issue 28): a detector's run SIGKILLed mid-epoch resumes bit-identical; two
processes match one at twice the micro-batch; the job queue reserves a detector's slot whole; tune and runs compare
work on a detector's map. (test_detection.py holds the end-to-end run on wide frames; a module of its own each, so
two test workers share them.)"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import trainforge
from test_crash_resume import assert_killed_run_matches_uninterrupted, two_process_losses
from test_detection import RETINA, overrides
from trainforge.cli import main
from trainforge.metrics_file import read_metrics
from vision_data import write_shapes


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    write_shapes(root, n=240, side=64, seed=0)
    return root



@pytest.mark.slow
@pytest.mark.serial
def test_a_detector_run_sigkilled_mid_epoch_resumes_bit_identical(shapes, tmp_path):
    """Faster R-CNN samples its anchors and proposals from torch's global generator: a resume restores it exactly."""
    args = overrides(shapes, "coco", "data.args.image_size=48", "train.max_steps=24", "train.eval_every_steps=12",
                     "train.checkpoint_every_steps=5", "train.log_every_steps=1", "train.global_batch_size=4",
                     "train.micro_batch_size=2",
                     "train.device=cpu", "data.augment={hflip: 0.5, crop_scale: [0.6, 1.0]}")
    args = [a for a in args if a != "data.augment={}"]
    assert_killed_run_matches_uninterrupted("coco_detection_finetune", args, tmp_path, steps=24)


@pytest.mark.slow
@pytest.mark.serial
def test_two_processes_on_a_detector_match_one_at_twice_the_micro_batch(shapes, tmp_path):
    common = overrides(shapes, "coco", "data.args.image_size=48", "train.max_steps=6", "train.eval_every_steps=6",
                       # SGD: Adam's update divides by the gradient's running size, which magnifies the last bits that
                       # two processes' sums leave different in parameters whose gradients are tiny
                       "train.log_every_steps=1", "optim={name: sgd, lr: 0.01, momentum: 0.9}",
                       "train.global_batch_size=4", "train.device=cpu", model=RETINA)
    losses = two_process_losses("coco_detection_finetune", [*common, "train.micro_batch_size=4"],
                                [*common, "train.micro_batch_size=2"], tmp_path)
    assert len(losses[0]) == len(losses[1]) == 6
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-5, losses


def test_the_queue_reserves_a_detection_jobs_slot_whole(shapes):
    """The planner cannot simulate a detector's step: the admission reserves the largest slot's memory for it (and
    pins micro_batch_size auto to the per-process batch), where a simulated job reserves its predicted peak."""
    from trainforge.jobs.admission import size_submission
    from trainforge.jobs.slots import Slot

    gib = 1 << 30
    slots = [Slot("cpu0", "cpu", "cpu", 2 * gib, 2 * gib), Slot("cpu1", "cpu", "cpu", gib, gib)]
    cfg = trainforge.load_config("coco_detection_finetune", overrides(shapes, "coco", "train.max_steps=8",
                                                                      "train.global_batch_size=4"))
    job = size_submission(cfg, 1, slots)
    assert job.memory_bytes == 2 * gib and job.micro_batch_size == 4 and "micro_batch_size: 4" in job.config_yaml


def test_mlflow_signature_of_a_detector_names_its_input_only():
    from trainforge.tracking.mlflow_run import signature

    sig = signature({"task": "detection", "input_shape": [3, 64, 64], "input_dtype": "float32", "num_classes": 3})
    assert sig.inputs.inputs[0].shape == (-1, 3, 64, 64) and sig.outputs is None
    seg = signature({"task": "segmentation", "input_shape": [3, 64, 64], "input_dtype": "float32", "num_classes": 3})
    assert seg.outputs.inputs[0].shape == (-1, 3, 64, 64)


@pytest.mark.slow
def test_tune_and_runs_compare_work_on_a_detectors_map(shapes, tmp_path, capsys):
    """tune maximizes the task's default metric (map) over two short trials; runs compare sets the trials side by
    side with their map curves and test numbers; bf16 autocast trains a detector on the CPU."""
    space = tmp_path / "space.yaml"
    space.write_text("optim.lr: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}\n")
    args = overrides(shapes, "coco", "data.args.image_size=48", "train.max_steps=4", "train.eval_every_steps=2",
                     "train.global_batch_size=4", "train.micro_batch_size=4", "train.device=cpu")
    with pytest.raises(SystemExit) as code:
        main(["tune", "coco_detection_finetune", *args, "--space", str(space), "--trials", "2", "--out",
              str(tmp_path / "study"), "--json"])
    assert code.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert doc["metric"] == "map" and doc["direction"] == "maximize" and doc["counts"]["complete"] == 2
    assert doc["best_trial"] is not None
    trials = sorted((tmp_path / "study" / "trials").iterdir())
    assert len(trials) == 2 and all((t / "eval.json").is_file() for t in trials)
    with pytest.raises(SystemExit) as code:
        main(["runs", "compare", *map(str, trials), "--out", str(tmp_path / "compare.html"), "--json"])
    assert code.value.code in (0, None)
    compared = json.loads(capsys.readouterr().out)
    assert {"map", "map_50"} <= set(compared["test_metrics"])
    assert 'Validation map_50' in (tmp_path / "compare.html").read_text()

    run = tmp_path / "bf16"
    cfg = trainforge.load_config("coco_detection_finetune", [*args, "train.precision=bf16"])
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    assert json.loads((run / "final" / "model.json").read_text())["ran"]["precision"] == "bf16"
    losses = [r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["split"] == "train"]
    assert losses and all(np.isfinite(losses))
