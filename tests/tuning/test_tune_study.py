"""Study helpers: continuation checks, what counts as finished, dead trials, pruners, seeds, worker placement."""
from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from trainforge.errors import UserError
from trainforge.tuning.study import (
    HOST,
    PRUNERS,
    count_finished,
    fail_dead_trials,
    open_storage,
    open_study,
    pid_alive,
    sampler_seed,
)
from trainforge.tuning.workers import placement

BASE = {"optim": {"lr": 0.001}, "train": {"max_steps": 40}}


@pytest.fixture()
def storage(tmp_path):
    return open_storage(f"sqlite:///{tmp_path / 'study.db'}")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_pruners_by_name():
    assert PRUNERS.names() == ["hyperband", "median", "none"]
    assert isinstance(PRUNERS.get("median")(), optuna.pruners.MedianPruner)
    assert isinstance(PRUNERS.get("hyperband")(), optuna.pruners.HyperbandPruner)
    assert isinstance(PRUNERS.get("none")(), optuna.pruners.NopPruner)
    with pytest.raises(UserError, match="--pruner: unknown pruner 'asha'; choose one of: hyperband, median, none"):
        PRUNERS.get("asha")


def test_a_study_is_continued_only_with_the_same_metric_and_config(storage):
    study = open_study(storage, "s", "maximize", "accuracy", BASE)
    study.add_trial(optuna.trial.create_trial(value=0.5, params={}, distributions={}))
    again = open_study(storage, "s", "maximize", "accuracy", BASE)
    assert len(again.get_trials()) == 1
    with pytest.raises(UserError, match="optimizes accuracy \\(maximize\\), not loss \\(minimize\\)"):
        open_study(storage, "s", "minimize", "loss", BASE)
    with pytest.raises(UserError, match="different recipe or overrides \\(differs in train.max_steps\\)"):
        open_study(storage, "s", "maximize", "accuracy", {**BASE, "train": {"max_steps": 80}})


def test_crashes_count_as_finished_interruptions_do_not():
    def trial(state, reason=None):
        attrs = {"fail_reason": reason} if reason else {}
        return optuna.trial.create_trial(state=state, value=1.0 if state == TrialState.COMPLETE else None,
                                         user_attrs=attrs)

    trials = [
        trial(TrialState.COMPLETE), trial(TrialState.PRUNED),
        trial(TrialState.FAIL, "error: RuntimeError: boom"), trial(TrialState.FAIL, "worker died: exit code -9"),
        trial(TrialState.FAIL, "interrupted: its process ended"), trial(TrialState.FAIL),  # heartbeat-failed: no reason
        trial(TrialState.RUNNING),
    ]
    assert count_finished(trials) == 4


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_trials_of_dead_processes_fail_and_live_ones_keep_running(storage):
    study = open_study(storage, "s", "maximize", "accuracy", BASE)
    gone, alive, elsewhere = study.ask(), study.ask(), study.ask()
    pid = dead_pid()
    assert not pid_alive(pid)
    gone.set_user_attr("host", HOST), gone.set_user_attr("pid", pid)
    alive.set_user_attr("host", HOST), alive.set_user_attr("pid", subprocess.os.getpid())
    elsewhere.set_user_attr("host", "another-machine"), elsewhere.set_user_attr("pid", pid)

    assert fail_dead_trials(study, storage) == [gone.number]
    states = {t.number: t for t in study.get_trials()}
    assert states[gone.number].state == TrialState.FAIL
    assert states[gone.number].user_attrs["fail_reason"].startswith("interrupted:")
    assert states[alive.number].state == TrialState.RUNNING
    assert states[elsewhere.number].state == TrialState.RUNNING  # another machine's: left to its heartbeat

    # a worker the coordinator saw die: its trial fails as a crash, whatever the pid's state
    assert fail_dead_trials(study, storage, pids={subprocess.os.getpid()}, reason=lambda t: "worker died: x") == [alive.number]
    assert count_finished(study.get_trials()) == 1


def test_seeds_differ_per_worker_and_per_continuation():
    seeds = {sampler_seed(0, existing, worker) for existing in (0, 3) for worker in (0, 1)}
    assert len(seeds) == 4
    assert sampler_seed(0, 3, 1) == sampler_seed(0, 3, 1)
    assert sampler_seed(1, 0, 0) != sampler_seed(0, 0, 0)


def test_workers_split_cpu_threads_or_take_one_gpu_each(monkeypatch):
    cpu = placement(4, set(), gpu_count=0, cpu_count=8)
    assert cpu.gpus == [] and "train.num_threads=2" in cpu.overrides
    assert "log.progress=false" in cpu.overrides
    assert "train.num_threads=1" in placement(4, set(), gpu_count=0, cpu_count=2).overrides
    single = placement(1, {"train.num_threads"}, gpu_count=0, cpu_count=8)
    assert single.overrides == []  # the user's own thread count is kept; one worker keeps its progress bar

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = placement(3, set(), gpu_count=2)
    assert [gpu.env(i)["CUDA_VISIBLE_DEVICES"] for i in range(3)] == ["0", "1", "0"]
    assert not any(o.startswith("train.num_threads") for o in gpu.overrides)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert [placement(2, set(), gpu_count=2).env(i)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["4", "6"]


def test_storage_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="--storage: cannot parse 'not a url'"):
        open_storage("not a url")
    with pytest.raises(UserError, match="--storage: cannot open sqlite:///.*nonexistent"):
        open_storage(f"sqlite:///{tmp_path}/nonexistent/dir/study.db")
    with pytest.raises(UserError) as e:
        open_storage("postgresql+psycopg://me:secret@127.0.0.1:1/db")
    assert "secret" not in str(e.value) and "me:***@127.0.0.1" in str(e.value)
