"""Job processes: the command line, the wrapper's exit record, /proc ownership checks, and how an end is judged."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jobs_helpers import wait_for
from trainforge.jobs import runner
from trainforge.jobs.slots import Slot
from trainforge.layout import JobDir

CPU = [Slot("cpu0", "cpu", "cpu", 2**30, 2**30)]
GPUS = [Slot("0", "gpu", "H100", 2**30, 2**30, 0), Slot("3", "gpu", "H100", 2**30, 2**30, 3)]


def test_train_argv_holds_only_server_made_paths(tmp_path):
    paths = JobDir(tmp_path / "jobs" / "7")
    argv = runner.train_argv("/py", paths, CPU, resume=False)
    assert argv == ["/py", "-m", "trainforge", "train", str(paths.recipe), "train.device=cpu", "train.num_threads=1",
                    "--run-dir", str(paths.run)]
    argv = runner.train_argv("/py", paths, GPUS, resume=True)
    assert argv[-4:] == ["--nproc-per-node", "2", "--resume", "auto"] and "train.device=cpu" not in argv
    wrapped = runner.wrapped_argv("/py", paths, 3, argv)
    assert wrapped[:7] == ["/py", "-m", "trainforge.jobs.wrapper", "--exit-file", str(paths.exit), "--attempt", "3"]
    assert wrapped[7:10] == ["--sandbox", str(paths.sandbox), "--"] and wrapped[10:] == argv
    assert runner.wrapped_argv("/py", paths, 3, argv, sandboxed=False)[7:] == ["--", *argv]


def test_job_env_pins_devices_and_gives_the_job_its_own_temp_folder(tmp_path):
    paths = JobDir(tmp_path / "jobs" / "7")
    assert runner.job_env({"A": "1"}, GPUS, paths)["CUDA_VISIBLE_DEVICES"] == "0,3"
    env = runner.job_env({"HOME": "/root", "TMPDIR": "/tmp"}, CPU, paths)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    for name in ("HOME", "TMPDIR", "TRAINFORGE_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert Path(env[name]) == paths.tmp or paths.tmp in Path(env[name]).parents, name


@pytest.mark.parametrize("rc, complete, cancel, restarts, expected_state, words", [
    (0, True, False, 0, "succeeded", None),
    (-9, True, False, 0, "succeeded", None),  # killed after the final model was written: done
    (-9, False, False, 0, "queued", "killed by SIGKILL"),
    (1, False, False, 1, "queued", "exit code 1"),
    (-9, False, False, 2, "failed", "killed by SIGKILL; last log line: boom (after 2 restart(s))"),
    (2, False, False, 0, "failed", "exit code 2; last log line: boom (bad input: not retried)"),
    (137, False, False, 2, "failed", "killed by SIGKILL"),
    (None, False, False, 0, "queued", "vanished"),
    (0, False, True, 0, "cancelled", "cancelled"),
    (-15, False, True, 0, "cancelled", "cancelled"),
])
def test_judge(rc, complete, cancel, restarts, expected_state, words):
    out = runner.judge(rc, complete=complete, cancel_requested=cancel, restarts=restarts, max_restarts=2, last_line="boom")
    assert out.state == expected_state
    if words:
        assert words in out.reason


def test_last_log_line_skips_the_servers_notes(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("epoch 1\nTraceback...\nValueError: bad\n\n[trainforge-jobs] attempt 1 ended\n")
    assert runner.last_log_line(log) == "ValueError: bad"
    assert runner.last_log_line(tmp_path / "missing") == ""


def _sleeper(run_dir: Path, seconds: float = 60) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(float(sys.argv[1]))", str(seconds),
                             "--run-dir", str(run_dir)], start_new_session=True)


def test_ownership_needs_the_run_dir_and_the_start_time(tmp_path):
    run_dir = tmp_path / "jobs" / "1" / "run"
    proc = _sleeper(run_dir)
    try:
        ticks = wait_for(lambda: runner.start_ticks(proc.pid), 5, "the process in /proc")
        assert runner.is_ours(proc.pid, ticks, run_dir)
        assert not runner.is_ours(proc.pid, ticks + 1, run_dir)  # same pid, another process (pid reuse)
        assert not runner.is_ours(proc.pid, ticks, tmp_path / "jobs" / "10" / "run")  # not a prefix match
        assert runner.job_processes(run_dir) == [proc.pid]
        runner.signal_job(proc.pid, signal.SIGKILL)
        wait_for(lambda: not runner.is_alive(proc.pid), 5, "the kill")  # a zombie counts as ended
        assert not runner.is_ours(proc.pid, ticks, run_dir)
    finally:
        proc.kill()
        proc.wait()
    assert runner.job_processes(run_dir) == []


def test_kill_leftovers_stops_every_process_of_a_run(tmp_path):
    run_dir = tmp_path / "run"
    procs = [_sleeper(run_dir) for _ in range(2)]
    try:
        wait_for(lambda: len(runner.job_processes(run_dir)) == 2, 5, "two processes")
        assert sorted(runner.kill_leftovers(run_dir)) == sorted(p.pid for p in procs)
        assert runner.job_processes(run_dir) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _wrapped(tmp_path: Path, code: str, attempt: int = 4) -> tuple[subprocess.Popen, JobDir]:
    paths = JobDir(tmp_path)
    argv = runner.wrapped_argv(sys.executable, paths, attempt, [sys.executable, "-c", code, str(paths.run)],
                               sandboxed=False)
    return subprocess.Popen(argv, start_new_session=True), paths


def test_wrapper_records_the_exit_code(tmp_path):
    proc, paths = _wrapped(tmp_path, "import sys; sys.exit(3)")
    assert proc.wait(timeout=30) == 3
    assert runner.read_exit(paths, 4) == 3
    assert runner.read_exit(paths, 5) is None  # another attempt's record is not this one's


def test_wrapper_records_a_signal_and_survives_the_group_sigterm(tmp_path):
    # the child handles SIGTERM like the trainer: finish up and exit 0; the wrapper must outlive it
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    paths = JobDir(tmp_path)
    argv = runner.wrapped_argv(sys.executable, paths, 1, [sys.executable, "-c", code, str(paths.run)],
                               sandboxed=False)
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    runner.signal_job(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert runner.read_exit(paths, 1) == 0

    proc, paths = _wrapped(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", attempt=2)
    assert proc.wait(timeout=30) == 128 + 9
    assert runner.read_exit(paths, 2) == -9
    assert runner.describe_exit(-9) == "killed by SIGKILL"


def test_killing_the_wrapper_kills_the_trainer(tmp_path):
    proc, paths = _wrapped(tmp_path, "import time; time.sleep(60)")
    try:
        child = wait_for(lambda: [p for p in runner.job_processes(paths.run) if p != proc.pid], 10, "the child")[0]
        proc.kill()  # SIGKILL the wrapper only
        proc.wait()
        wait_for(lambda: not runner.is_alive(child), 10, "the orphaned child to die (PR_SET_PDEATHSIG)")
        assert runner.read_exit(paths, 4) is None
    finally:
        runner.kill_leftovers(paths.run)
