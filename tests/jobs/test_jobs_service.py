"""The queue with real trainer processes: restarts with --resume auto, bad input not retried, cancel, and
reconciling the table with the processes that exist after a server restart."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs_helpers import (QUICK, latest_checkpoint_step, make_service, metrics_rows, quick_job_bytes, stop_all_jobs,
                          trainer_pid, wait_for, with_steps)
from trainforge.errors import UserError
from trainforge.jobs import runner
from trainforge.jobs.service import StateDirLock, Submission


def assert_trained_once(run_dir: Path, steps: int) -> None:
    rows = metrics_rows(run_dir)
    keys = [(r["split"], r["step"]) for r in rows]
    assert len(keys) == len(set(keys)), "a step was logged twice: two processes, or a replay"
    assert max(r["step"] for r in rows) == steps
    assert runner.run_complete(run_dir)


@pytest.fixture
def service(tmp_path):
    svc = make_service(tmp_path, "cpu:2", data_roots=[tmp_path.resolve()])
    yield svc
    svc.stop()
    stop_all_jobs(svc)


@pytest.mark.slow
def test_a_killed_job_resumes_and_one_without_restarts_left_fails(service):
    service.start()
    a = service.enqueue(Submission("digits_cnn", overrides=tuple(with_steps(150)), max_restarts=1))
    b = service.enqueue(Submission("digits_cnn", overrides=tuple(with_steps(150)), max_restarts=0))
    dirs = {j.id: service.paths(j.id) for j in (a, b)}
    for j in (a, b):
        wait_for(lambda: latest_checkpoint_step(dirs[j.id].run) >= 4, 90, f"job {j.id}'s first checkpoint")
        pid = trainer_pid(dirs[j.id].path)
        assert pid, "the trainer process"
        runner.signal_job(pid, signal.SIGKILL)  # the whole job dies, as on an OOM kill or a node fault
    wait_for(lambda: service.store.get(a.id).state in ("succeeded", "failed")
             and service.store.get(b.id).state in ("succeeded", "failed"), 120, "both jobs to end")

    done = service.store.get(a.id)
    assert (done.state, done.restarts, done.attempt) == ("succeeded", 1, 2)
    log = dirs[a.id].log.read_text()
    assert "attempt 1 ended: killed by SIGKILL" in log and "--resume auto" in log and "resumed at step" in log
    assert_trained_once(dirs[a.id].run, 150)

    failed = service.store.get(b.id)
    assert (failed.state, failed.restarts, failed.attempt) == ("failed", 0, 1)
    assert failed.reason.startswith("killed by SIGKILL") and failed.reason.endswith("(after 0 restart(s))")
    assert runner.job_processes(dirs[b.id].run) == []


@pytest.mark.slow
def test_bad_input_exit_code_2_is_not_retried(service, tmp_path):
    csv = tmp_path / "table.csv"
    csv.write_text("a,b,label\n" + "".join(f"{i % 7},{i % 3},{i % 2}\n" for i in range(80)))
    job = service.enqueue(Submission("digits_cnn", overrides=(*QUICK, "data.source=csv", f"data.path={csv}",
                                                              "model.name=mlp", "model.args={}",
                                                              "data.augment.rotation_deg=0", "data.augment.crop_scale=null",
                                                              "train.global_batch_size=8"),
                                  max_restarts=3))
    csv.unlink()  # the data disappears after the job was accepted: the trainer exits 2
    service.tick()
    assert service.store.get(job.id).state == "running"

    def ended():
        service.tick()
        return service.store.get(job.id).state != "running"

    wait_for(ended, 60, "the job to end", 0.2)
    got = service.store.get(job.id)
    assert (got.state, got.restarts, got.attempt) == ("failed", 0, 1)
    assert got.reason.startswith("exit code 2; last log line: ") and "(bad input: not retried)" in got.reason
    assert "table.csv" in got.reason  # the trainer's one-line error names the file


@pytest.mark.slow
def test_cancel_stops_a_running_job_after_a_checkpoint(service):
    service.start()
    job = service.enqueue(Submission("digits_cnn", overrides=tuple(with_steps(5000))))
    paths = service.paths(job.id)
    wait_for(lambda: latest_checkpoint_step(paths.run) >= 4, 90, "the first checkpoint")
    assert service.cancel(job.id).state == "running"  # until the process has saved and exited
    wait_for(lambda: service.store.get(job.id).state == "cancelled", 60, "the cancel")
    got = service.store.get(job.id)
    assert got.reason == "cancelled by the user" and got.restarts == 0
    assert "SIGTERM: checkpoint saved at step" in paths.log.read_text()
    assert runner.read_exit(paths, 1) == 0  # the trainer stopped cleanly
    assert runner.job_processes(paths.run) == []
    assert service.cancel(job.id).state == "cancelled"  # cancelling twice is harmless


def test_small_jobs_share_a_slot_and_nothing_is_overcommitted(tmp_path):
    need = quick_job_bytes()
    service = make_service(tmp_path, "cpu:2", slot_memory_gb=2.5 * need / 2**30, placement="pack")  # two per slot
    jobs = []
    try:
        jobs = [service.enqueue(Submission("digits_cnn", overrides=tuple(QUICK), priority=p)) for p in (0, 0, 0, 0, 0, 1)]
        service.tick()
        placed = {j.id: (service.store.get(j.id).state, service.store.get(j.id).slots) for j in jobs}
        # priority 1 first; pack (best fit) then fills cpu0 before opening cpu1; the sixth job waits for room
        assert placed == {6: ("running", ["cpu0"]), 1: ("running", ["cpu0"]), 2: ("running", ["cpu1"]),
                          3: ("running", ["cpu1"]), 4: ("queued", []), 5: ("queued", [])}
        views = service.slot_views()
        assert [(v["id"], len(v["jobs"]), v["reserved_bytes"] <= v["memory_bytes"]) for v in views] == \
            [("cpu0", 2, True), ("cpu1", 2, True)]
        pids = [service.store.get(i).pid for i in (6, 1, 2, 3)]
        assert all(pids) and len(set(pids)) == 4  # one process per job, even on a shared slot
    finally:
        for j in jobs:
            service.cancel(j.id)
        wait_for(lambda: (service.tick(), all(service.store.get(j.id).state == "cancelled" for j in jobs))[1], 60,
                 "the cancels", 0.2)
        stop_all_jobs(service)


@pytest.mark.parametrize("placement, expected", [(None, ["0", "1", "0"]), ("spread", ["0", "1", "0"]),
                                                 ("pack", ["0", "0", "1"])])
def test_the_services_placement_decides_the_slots(tmp_path, monkeypatch, placement, expected):
    """Jobs of 10, 30 and 30 GiB on two 40 GiB slots (the issue's example): spread by default, pack on request."""
    kwargs = {} if placement is None else {"placement": placement}
    service = make_service(tmp_path, "cpu:2", slot_memory_gb=40.0, **kwargs)
    monkeypatch.setattr(service.backend, "_launch", lambda job: None)  # where jobs go, not running them
    for gib in (10, 30, 30):
        service.store.create(job_dir_for=lambda i: str(service.paths(i).path), name="j", recipe="digits_cnn",
                             overrides=[], config_yaml="name: j\n", num_gpus=1, priority=0, max_restarts=0,
                             memory_bytes=gib * 2**30, total_steps=20)
    service.backend.schedule()
    assert [(j.state, j.slots) for j in service.store.list()] == [("running", [f"cpu{s}"]) for s in expected]


def test_an_unknown_placement_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"^--placement: expected spread or pack, got 'balance'$"):
        make_service(tmp_path, "cpu:2", placement="balance")


# ---------------------------------------------------------------- reconcile after a server restart


def running_job(service, *, pid=None, ticks=None, attempt_exit=None, complete=False):
    """A job the table calls running, as a crashed server would have left it."""
    job = service.store.create(job_dir_for=lambda i: str(service.paths(i).path), name="j", recipe="digits_cnn",
                               overrides=[], config_yaml="name: j\n", num_gpus=1, priority=0, max_restarts=2,
                               memory_bytes=1000, total_steps=20)
    service.store.claim(job.id, ["cpu0"])
    if pid is not None:
        service.store.set_process(job.id, pid, ticks)
    paths = service.paths(job.id)
    paths.run.mkdir(parents=True)
    if attempt_exit is not None:
        paths.exit.write_text(json.dumps({"attempt": 1, "returncode": attempt_exit}))
    if complete:
        (paths.run / "final").mkdir()
        (paths.run / "final" / "model.safetensors").write_bytes(b"x")
        (paths.run / "eval.json").write_text("{}")
    return job, paths


def sleeper(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--run-dir", str(run_dir)],
                            start_new_session=True)


def test_reconcile_adopts_a_live_job_and_judges_it_when_it_ends(service):
    job, paths = running_job(service)
    proc = sleeper(paths.run)
    try:
        ticks = wait_for(lambda: runner.start_ticks(proc.pid), 5, "the process")
        service.store.set_process(job.id, proc.pid, ticks)
        service.reconcile()
        got = service.store.get(job.id)
        assert (got.state, got.pid, got.attempt) == ("running", proc.pid, 1)  # adopted, not started again
        service.tick()
        assert service.store.get(job.id).state == "running" and runner.job_processes(paths.run) == [proc.pid]
        assert "adopted by a restarted server" in paths.log.read_text()
        # it ends while we are not its parent: the wrapper's exit record and the run dir tell how
        paths.exit.write_text(json.dumps({"attempt": 1, "returncode": -9}))
        proc.kill()
        proc.wait()
        service.tick()  # requeued (restart 1 of 2) and started again for real
        got = service.store.get(job.id)
        assert got.restarts == 1 and got.reason.startswith("killed by SIGKILL")
    finally:
        proc.kill()
        proc.wait()


def test_reconcile_judges_jobs_whose_process_is_gone(service):
    done, _ = running_job(service, pid=999_999_999, ticks=1, attempt_exit=-9, complete=True)
    killed, _ = running_job(service, pid=999_999_998, ticks=1, attempt_exit=-9)
    bad, _ = running_job(service, pid=999_999_997, ticks=1, attempt_exit=2)
    vanished, _ = running_job(service, pid=999_999_996, ticks=1)
    never_started, _ = running_job(service)
    import os

    not_ours, _ = running_job(service, pid=os.getpid(), ticks=runner.start_ticks(os.getpid()))  # a reused pid
    service.reconcile()
    state = {j: (service.store.get(j.id).state, service.store.get(j.id).restarts) for j in
             (done, killed, bad, vanished, never_started, not_ours)}
    assert state[done] == ("succeeded", 0)
    assert state[killed] == ("queued", 1) and service.store.get(killed.id).resume
    assert state[bad] == ("failed", 0)
    assert state[vanished] == ("queued", 1) and "vanished" in service.store.get(vanished.id).reason
    assert state[never_started] == ("queued", 0)  # claimed, never started: no restart counted
    assert state[not_ours] == ("queued", 1)


def test_a_queued_job_too_big_for_a_restarted_servers_slots_fails_instead_of_blocking(tmp_path):
    big = make_service(tmp_path, "cpu:1", slot_memory_gb=1.0)
    job = big.enqueue(Submission("digits_cnn", overrides=tuple(QUICK)))
    small = make_service(tmp_path, "cpu:1", slot_memory_gb=job.memory_bytes / 2 / 2**30)  # same table and state
    small.tick()
    got = small.store.get(job.id)
    assert got.state == "failed" and got.reason.startswith("cannot run on this server's slots: needs")
    assert got.attempt == 0


def test_one_server_per_state_dir(tmp_path):
    first = StateDirLock(tmp_path)
    first.acquire()
    with pytest.raises(UserError, match="in use by another trainforge server"):
        StateDirLock(tmp_path).acquire()
    first.release()
    StateDirLock(tmp_path).acquire()
