"""Real studies on digits: pruning, continuation, a SIGKILLed tune run, crashing trials in parallel workers.

Trials are short (a small CNN or MLP, 40 steps, an evaluation every 10) and single-threaded.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
from optuna.trial import TrialState

import trainforge
from trainforge.cli import main
from trainforge.hardware.cpus import available_cpus

SHORT = [
    "train.max_steps=40", "train.eval_every_steps=10", "train.num_threads=1", "log.progress=false",
    "log.tensorboard=false", "log.report=false", "data.num_workers=0", "model.args.channels=[8,16]",
]
SPACE = """\
optim.lr: {type: float, low: 1.0e-4, high: 5.0e-2, log: true}
model.args.dropout: {type: float, low: 0.0, high: 0.3}
"""


def tune_cli(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", *args, "--json"])
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err
    return json.loads(captured.out)


def load_trials(out: Path, name: str = "digits_cnn") -> list:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")
    return sorted(study.get_trials(), key=lambda t: t.number)


def summary(trials: list) -> list[tuple]:
    return [(t.number, t.state, t.value, t.params) for t in trials]


@pytest.mark.slow
def test_study_prunes_continues_and_beats_the_default(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "study"
    args = ["digits_cnn", *SHORT, "--space", str(space), "--out", str(out)]

    first = tune_cli([*args, "--trials", "3"], capsys)
    assert first["counts"] == {"complete": 3, "pruned": 0, "failed": 0}  # the median pruner's 3 startup trials
    before = summary(load_trials(out))

    # the same command asking for 8: the study continues, 5 more trials, the first 3 untouched
    result = tune_cli([*args, "--trials", "8"], capsys)
    trials = load_trials(out)
    assert len(trials) == 8
    assert summary(trials[:3]) == before
    assert result["counts"]["complete"] + result["counts"]["pruned"] == 8
    assert result["counts"]["pruned"] >= 1
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert all(len(t.intermediate_values) < 4 for t in pruned)  # stopped before the last of 4 evaluations
    assert all(not (Path(t.user_attrs["run_dir"]) / "final").exists() for t in pruned)

    # the best trial is at least as good as the recipe's defaults with the same budget (not a trial here)
    default = trainforge.train("digits_cnn", overrides=SHORT, run_dir=tmp_path / "default")
    best = result["best_trial"]
    assert best["value"] >= default.val["accuracy"]
    assert best["value"] == max(t.value for t in trials if t.state == TrialState.COMPLETE)

    # best_config.yaml trains as a recipe and holds the best parameters; trials.csv has every trial
    best_path = Path(result["paths"]["best_config"])
    assert best_path.read_text().splitlines()[0] == f"# trainforge train {best_path}"
    cfg = trainforge.load_config(str(best_path))
    assert cfg.optim.lr == pytest.approx(best["params"]["optim.lr"])
    assert cfg.model.args["dropout"] == pytest.approx(best["params"]["model.args.dropout"])
    assert cfg.train.max_steps == 40 and cfg.model.args["channels"] == [8, 16]
    rows = Path(result["paths"]["trials_csv"]).read_text().splitlines()
    assert rows[0] == "number,state,value,optim.lr,model.args.dropout,duration_s,run_dir"
    assert len(rows) == 9 and sum(",PRUNED," in r for r in rows) == result["counts"]["pruned"]
    html = Path(result["paths"]["report"]).read_text()
    assert html.count("data:image/png;base64,") == 3  # history, evaluations, importances
    assert result["study"] == "digits_cnn" and result["storage"] == f"sqlite:///{out.resolve() / 'study.db'}"


@pytest.mark.slow
def test_a_killed_tune_run_is_finished_by_the_same_command(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "study"
    args = ["digits_cnn", *SHORT, "--space", str(space), "--out", str(out), "--trials", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "trainforge", "tune", *args], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = out / "trials" / "trial-0000" / "config.yaml"  # written when the trial's training starts
    deadline = time.monotonic() + 120
    while not started.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the first trial never started"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the tune process and its worker, mid-trial
    proc.wait()
    proc.stderr.close()
    assert [t.state for t in load_trials(out)] == [TrialState.RUNNING]  # nobody was left to say otherwise

    result = tune_cli(args, capsys)
    trials = load_trials(out)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].user_attrs["fail_reason"].startswith("interrupted:")
    assert result["counts"] == {"complete": 1, "pruned": 0, "failed": 1}
    assert result["best_trial"]["number"] == 1


@pytest.mark.slow
def test_parallel_workers_survive_a_crashing_trial_and_a_dying_worker(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("model.args.width: {type: int, low: 8, high: 32}\n")
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "study"
    overrides = [o for o in SHORT if not o.startswith(("model.", "train.num_threads"))] + [
        "model.name=custom", "model.target=tune_models:crash_once", "model.args={}", f"model.args.marker_dir={markers}",
    ]
    result = tune_cli(["digits_cnn", *overrides, "--space", str(space), "--out", str(out), "--trials", "4",
                       "--parallel", "2", "--pruner", "none"], capsys)
    trials = load_trials(out)
    assert len(trials) == 4
    reasons = sorted(t.user_attrs.get("fail_reason", "")[:12] for t in trials if t.state == TrialState.FAIL)
    assert reasons == ["error: Runti", "worker died:"]  # one raised in training, one took its worker down
    assert result["counts"] == {"complete": 2, "pruned": 0, "failed": 2}
    # on a CPU-only machine the two workers split the cores (with GPUs each would get its own instead)
    threads = {trainforge.load_config(str(Path(t.user_attrs["run_dir"]) / "config.yaml")).train.num_threads
               for t in trials if t.state == TrialState.COMPLETE}
    assert threads == ({None} if torch.cuda.device_count() else {max(1, available_cpus() // 2)})
