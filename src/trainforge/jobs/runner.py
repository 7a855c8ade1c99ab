"""Job processes: start one attempt, find it again after a server restart, judge how it ended.

Each attempt is
    python -m trainforge.jobs.wrapper --exit-file <job>/exit.json --attempt K --sandbox <job>/sandbox.json -- \\
        python -m trainforge train <job>/job.yaml [train.device=cpu train.num_threads=1] \\
        --run-dir <job>/run [--nproc-per-node N] [--resume auto]
started from an argv list (never a shell) in its own session, in <job>/ as its working directory (so a
relative name in the recipe, such as a hub id "org/name", names no file of the server's working
directory), with stdout and stderr appended to <job>/log.txt. The user's recipe and overrides never reach
the argv: they are frozen into job.yaml at submit time, so the command line only ever holds paths the
server made. The wrapper survives a server crash with its job and writes the exit status to exit.json, so
a restarted server knows how the attempt ended even though it is no longer the parent.

A process is "ours" when /proc/<pid> exists, is not a zombie, started at the recorded time (pid reuse)
and has the job's run directory as an argument.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from trainforge.files import read_regular
from trainforge.jobs.environment import private_cache_env
from trainforge.jobs.slots import Slot
from trainforge.layout import EVAL, FINAL, WEIGHTS, JobDir

EXIT_BAD_INPUT = 2  # trainforge's exit code for a user error: retrying cannot help
LOG_HEADER = "[trainforge-jobs]"  # prefix of the lines the server itself writes into a job's log


def train_argv(python: str, paths: JobDir, slots: Sequence[Slot], resume: bool) -> list[str]:
    """The trainer's command line; everything in it is a path the server made or a fixed token."""
    argv = [python, "-m", "trainforge", "train", str(paths.recipe)]
    if slots and slots[0].kind == "cpu":
        argv += ["train.device=cpu", "train.num_threads=1"]  # a CPU slot is one core's worth of work
    argv += ["--run-dir", str(paths.run)]
    if len(slots) > 1:
        argv += ["--nproc-per-node", str(len(slots))]
    if resume:
        argv += ["--resume", "auto"]
    return argv


def wrapped_argv(python: str, paths: JobDir, attempt: int, argv: Sequence[str], sandboxed: bool = True) -> list[str]:
    fence = ["--sandbox", str(paths.sandbox)] if sandboxed else []
    return [python, "-m", "trainforge.jobs.wrapper", "--exit-file", str(paths.exit), "--attempt", str(attempt),
            *fence, "--", *argv]


def job_env(base: dict[str, str], slots: Sequence[Slot], paths: JobDir) -> dict[str, str]:
    """`base` (the allow-listed part of the server's environment, jobs/environment.py) plus what this attempt needs:
    its devices, and its own temp folder as HOME, TMPDIR and cache."""
    env = dict(base)
    env.update(private_cache_env(paths.tmp))
    env["PYTHONUNBUFFERED"] = "1"  # the log shows lines as they are printed
    if slots and slots[0].kind == "gpu":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(s.index) for s in slots)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU slot must not grab a GPU
        env["OMP_NUM_THREADS"] = "1"
    return env


def start_attempt(paths: JobDir, argv: Sequence[str], env: dict[str, str], header: str) -> subprocess.Popen:
    """Start the wrapped attempt in its own session (it outlives a server crash), output appended to the log."""
    paths.path.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths.exit.unlink(missing_ok=True)
    with open(os.open(paths.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as log:
        log.write(f"{LOG_HEADER} {header}\n".encode())
        log.flush()
        # umask 077: the run directory, checkpoints and logs a job writes are its owner's alone
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=paths.path, start_new_session=True, close_fds=True, umask=0o077)


# ---------------------------------------------------------------- processes as /proc sees them


def _proc_stat(pid: int) -> Optional[list[str]]:
    """Fields of /proc/<pid>/stat after the command name (state is [0], start time is [19])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def start_ticks(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot: with the pid, it names one process for good."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: Optional[int]) -> bool:
    """Running (a zombie waiting for its parent to reap it has ended)."""
    if not pid:
        return False
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_ours(pid: Optional[int], ticks: Optional[int], run_dir: Path) -> bool:
    """`pid` is still the process we started for this job (not a reused pid)."""
    if not is_alive(pid):
        return False
    if ticks is not None and start_ticks(pid) != ticks:
        return False
    return str(run_dir) in cmdline(pid)


def job_processes(run_dir: Path) -> list[int]:
    """Live processes that have `run_dir` as an argument: the wrapper, the trainer, torchrun workers."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me:
            pid = int(entry.name)
            if str(run_dir) in cmdline(pid) and is_alive(pid):
                found.append(pid)
    return sorted(found)


def signal_job(pid: int, sig: int) -> None:
    """Signal the job's whole process group (the wrapper leads it): trainer, data workers, torchrun workers."""
    try:
        os.killpg(os.getpgid(pid), sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_leftovers(run_dir: Path, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL any process still holding `run_dir` and wait for it to go: two attempts never overlap."""
    pids = job_processes(run_dir)
    for pid in pids:
        signal_job(pid, signal.SIGKILL)
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    while any(is_alive(p) for p in pids) and time.monotonic() < deadline:
        for p in pids:
            try:
                os.waitpid(p, os.WNOHANG)  # reap it if it is our child
            except ChildProcessError:
                pass
        time.sleep(0.05)
    return pids


# ---------------------------------------------------------------- how an attempt ended


def read_exit(paths: JobDir, attempt: int) -> Optional[int]:
    """The trainer's return code the wrapper recorded for `attempt` (negative: killed by that signal)."""
    try:
        doc = json.loads(paths.exit.read_text())
    except (OSError, ValueError):
        return None
    if doc.get("attempt") != attempt or not isinstance(doc.get("returncode"), int):
        return None
    return doc["returncode"]


def run_complete(run_dir: Path) -> bool:
    """The trainer got to the end: the final model and the test metrics are written."""
    return (run_dir / EVAL).is_file() and (run_dir / FINAL / WEIGHTS).is_file()


def describe_exit(returncode: Optional[int]) -> str:
    if returncode is None:
        return "the job's process vanished without an exit status"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode > 128 and returncode - 128 in signal.Signals._value2member_map_:  # the wrapper's 128+N
        return f"killed by {signal.Signals(returncode - 128).name}"
    return f"exit code {returncode}"


def last_log_line(log: Path, max_bytes: int = 16384) -> str:
    """The process's last non-empty output line (the server's own header lines skipped)."""
    try:
        lines = read_regular(log, max_bytes, tail=True)[0].decode(errors="replace").splitlines()
    except OSError:  # gone, or not a regular file: the server never blocks on what a job could make of it
        return ""
    for line in reversed(lines):
        line = line.strip()
        if line and not line.startswith(LOG_HEADER):
            return line[:300]
    return ""


@dataclass(frozen=True)
class Outcome:
    state: str  # succeeded | failed | cancelled | queued (restart)
    reason: Optional[str]


def judge(returncode: Optional[int], *, complete: bool, cancel_requested: bool, restarts: int, max_restarts: int,
          last_line: str) -> Outcome:
    """What an ended attempt means: done, cancelled, restarted (with --resume auto) or failed for good."""
    if complete and returncode == EXIT_BAD_INPUT:  # the model and eval.json are there, but the run said it failed
        detail = f"{describe_exit(returncode)}; last log line: {last_line}" if last_line else describe_exit(returncode)
        return Outcome("failed", f"{detail} (after writing its final model and eval.json: not retried)")
    if complete:  # the final model and eval.json exist: the work is done however the process ended (a kill after)
        return Outcome("succeeded", None if not cancel_requested else "finished before the cancel took effect")
    if cancel_requested:
        return Outcome("cancelled", "cancelled by the user")
    how = describe_exit(returncode)
    detail = f"{how}; last log line: {last_line}" if last_line else how
    if returncode == EXIT_BAD_INPUT:
        return Outcome("failed", f"{detail} (bad input: not retried)")
    if restarts >= max_restarts:
        return Outcome("failed", f"{detail} (after {restarts} restart(s))")
    return Outcome("queued", detail)
