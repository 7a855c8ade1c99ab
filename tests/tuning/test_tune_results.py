"""Study results from hand-made trials: trials.csv, best_config.yaml, report.html, and the JSON summary."""
from __future__ import annotations

import csv
from datetime import datetime, timedelta

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from trainforge.config import load_config
from trainforge.errors import JobFailed
from trainforge.tuning.api import no_trial_completed, write_results

DISTS = {"optim.lr": FloatDistribution(1e-4, 1e-1, log=True), "train.global_batch_size": CategoricalDistribution([32, 64])}
START = datetime(2026, 1, 1, 12, 0, 0)


def add(study, number_s: float, state, value=None, lr=1e-3, batch=64, steps=(), reason=None):
    attrs = {"run_dir": f"/runs/trial-{len(study.get_trials()):04d}"}
    if reason:
        attrs["fail_reason"] = reason
    study.add_trial(optuna.trial.FrozenTrial(
        number=0, trial_id=0, state=state, value=value, values=None, system_attrs={}, user_attrs=attrs,
        params={"optim.lr": lr, "train.global_batch_size": batch}, distributions=DISTS,
        intermediate_values={i + 1: v for i, v in enumerate(steps)},
        datetime_start=START, datetime_complete=START + timedelta(seconds=number_s),
    ))


@pytest.fixture()
def base():
    return load_config("digits_cnn", ["train.max_steps=40", "train.micro_batch_size=32"]).model_dump(mode="json")


def test_results_of_a_mixed_study(tmp_path, base):
    study = optuna.create_study(direction="maximize")
    add(study, 3.0, TrialState.COMPLETE, 0.80, lr=1e-3, batch=64, steps=[0.5, 0.7, 0.8])
    add(study, 2.5, TrialState.COMPLETE, 0.91, lr=2e-2, batch=32, steps=[0.6, 0.85, 0.91])
    add(study, 1.0, TrialState.PRUNED, 0.40, lr=1e-4, batch=64, steps=[0.3, 0.4])
    add(study, 0.5, TrialState.FAIL, lr=5e-2, batch=32, reason="error: RuntimeError: boom")
    add(study, 4.0, TrialState.COMPLETE, 0.88, lr=1e-2, batch=64, steps=[0.6, 0.8, 0.88])

    result = write_results(study, tmp_path, base, ["optim.lr", "train.global_batch_size"], "s", "sqlite:///x.db",
                           "accuracy", "maximize")
    assert result["best_trial"]["number"] == 1 and result["best_trial"]["value"] == 0.91
    assert result["best_trial"]["params"] == {"optim.lr": 2e-2, "train.global_batch_size": 32}
    assert result["counts"] == {"complete": 3, "pruned": 1, "failed": 1}
    assert no_trial_completed(result) is None

    with open(result["paths"]["trials_csv"]) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["number", "state", "value", "optim.lr", "train.global_batch_size", "duration_s", "run_dir"]
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE", "PRUNED", "FAIL", "COMPLETE"]
    assert rows[1]["value"] == "0.91" and rows[1]["duration_s"] == "2.5" and rows[1]["run_dir"] == "/runs/trial-0001"
    assert rows[3]["value"] == ""

    best_path = tmp_path / "best_config.yaml"
    text = best_path.read_text()
    assert text.splitlines()[0] == f"# trainforge train {best_path}"
    cfg = load_config(str(best_path))
    assert cfg.optim.lr == 2e-2 and cfg.train.global_batch_size == 32
    assert cfg.train.max_steps == 40 and cfg.train.micro_batch_size == 32  # the overrides every trial had

    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3  # history, evaluations, importances
    for text in ("Optimization history", "Parameter importances", "error: RuntimeError: boom", "best optim.lr"):
        assert text in html


def test_a_study_with_one_complete_trial_explains_the_missing_importances(tmp_path, base):
    study = optuna.create_study(direction="minimize")
    add(study, 1.0, TrialState.COMPLETE, 0.3, steps=[0.5, 0.3])
    add(study, 1.0, TrialState.PRUNED, 0.9, steps=[0.9])
    result = write_results(study, tmp_path, base, ["optim.lr", "train.global_batch_size"], "s", "u", "loss", "minimize")
    html = (tmp_path / "report.html").read_text()
    assert "need at least 2 complete trials; this study has 1" in html
    assert html.count("data:image/png;base64,") == 2
    assert result["best_trial"]["number"] == 0


def test_no_complete_trial_is_a_failed_job_without_a_best_config(tmp_path, base):
    study = optuna.create_study(direction="maximize")
    add(study, 1.0, TrialState.FAIL, reason="error: ValueError: x")
    add(study, 1.0, TrialState.PRUNED, 0.2, steps=[0.2])
    result = write_results(study, tmp_path, base, ["optim.lr", "train.global_batch_size"], "s", "u", "accuracy", "maximize")
    assert result["best_trial"] is None and result["paths"]["best_config"] is None
    assert not (tmp_path / "best_config.yaml").exists()
    assert (tmp_path / "trials.csv").exists() and (tmp_path / "report.html").exists()
    failed = no_trial_completed(result)
    assert isinstance(failed, JobFailed) and "no trial completed (1 pruned, 1 failed)" in str(failed)
