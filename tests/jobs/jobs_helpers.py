"""Shared helpers for the job-queue tests: tiny job overrides, waiting, a live server, PostgreSQL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

from chromium import CHROMIUM_MISSING  # noqa: F401  (tests import it from here)
from postgres_server import free_port  # noqa: F401  (tests import it from here)

CLIENT = {"X-Trainforge-Client": "test"}


# A digits run of a few seconds: checkpoints often so a kill loses little and a resume has something to use.
QUICK = [
    "train.max_steps=20",
    "train.eval_every_steps=10",
    "train.checkpoint_every_steps=4",
    "train.log_every_steps=2",
    "log.progress=false",
    "log.tensorboard=false", "log.report=false",
    "data.num_workers=0",
    "train.early_stopping=null",  # the recipe's early stopping would end long test jobs early
]


def with_steps(steps: int, overrides: list[str] = QUICK) -> list[str]:
    return [o for o in overrides if not o.startswith("train.max_steps=")] + [f"train.max_steps={steps}"]


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def metrics_rows(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def latest_checkpoint_step(run_dir: Path) -> int:
    try:
        return int((Path(run_dir) / "checkpoints" / "latest").read_text().strip().removeprefix("step-"))
    except (OSError, ValueError):
        return -1


def trainer_pid(job_dir: Path) -> Optional[int]:
    """The live `trainforge train` process of a job (the wrapper's child), if any."""
    from trainforge.jobs.runner import cmdline, job_processes

    for pid in job_processes(Path(job_dir) / "run"):
        argv = cmdline(pid)
        if "trainforge.jobs.wrapper" not in argv and "train" in argv:
            return pid
    return None


class LiveServer:
    """The real app on a real port, served by uvicorn in a thread of the test process, as `trainforge server` serves it."""

    def __init__(self, service, token: Optional[str] = None, manage_service: bool = True, **limits) -> None:
        """`limits`: `server_config`'s request_timeout_s / max_partial, for a test of them that must be quick."""
        import uvicorn

        from trainforge.jobs.server import create_app, server_config

        self.service = service
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = server_config(create_app(service, token=token, manage_service=manage_service), host="127.0.0.1",
                               port=self.port, **limits)  # the settings `trainforge server` runs with
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "the test server to start", 0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        stop_all_jobs(self.service)


def stop_all_jobs(service) -> None:
    """Leave no job process behind a test."""
    from trainforge.jobs.runner import kill_leftovers

    jobs_root = service.state_dir / "jobs"
    if jobs_root.is_dir():
        for job_dir in jobs_root.iterdir():
            kill_leftovers(job_dir / "run")
    for popen in list(getattr(service.backend, "popens", {}).values()):
        popen.wait(timeout=10)


def quick_job_bytes(overrides: list[str] = QUICK) -> int:
    """The planner's peak for a QUICK digits job on a CPU slot: what the scheduler reserves for it."""
    from trainforge.jobs.admission import admit
    from trainforge.jobs.slots import Slot

    return admit(recipe="digits_cnn", recipe_yaml=None, overrides=overrides, num_gpus=1,
                 slots=[Slot("cpu0", "cpu", "cpu", 2**40, 2**40)]).memory_bytes


def landlock_missing() -> str:
    """Why the fence cannot be tested on this kernel ("" when it can)."""
    from trainforge.jobs import sandbox

    abi = sandbox.landlock_abi()
    return "" if abi >= sandbox.MIN_ABI else f"needs Landlock: {sandbox.unavailable_reason(abi)}"


def make_service(tmp_path: Path, slots: str = "cpu:2", slot_memory_gb: float = 1.0, **kwargs):
    from trainforge.jobs.service import JobService
    from trainforge.jobs.slots import parse_slots
    from trainforge.jobs.store import Store, sqlite_url

    # jobs are fenced wherever the kernel can fence them; elsewhere the queue's own tests still run (unfenced)
    kwargs.setdefault("sandboxed", not landlock_missing())

    state = tmp_path / "state"
    store = Store(sqlite_url(tmp_path / "jobs.db"))
    return JobService(store, parse_slots(slots, slot_memory_gb), state, poll_s=0.2, **kwargs)


def kill_quietly(pid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class ServerProcess:
    """`trainforge server` in a process of its own, its stdout and stderr in a log file; stopped by its pid."""

    def __init__(self, tmp_path: Path, data_root: Path, *flags: str, gpus: str = "cpu:1",
                 state: Optional[Path] = None) -> None:
        self.log = tmp_path / f"server{'-'.join(flags)}.log"
        self.state = state or tmp_path / f"state{'-'.join(flags)}"
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainforge", "server", "--gpus", gpus, "--slot-memory-gb", "2", "--port", port,
                 "--state-dir", str(self.state), "--data-root", str(data_root), "--unsandboxed-jobs", *flags],
                stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)

    def __enter__(self) -> "ServerProcess":
        def healthy() -> bool:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                return httpx.get(self.url + "/api/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, 90, "the server to answer", 0.2)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30) -> bool:
        """SIGTERM, then SIGKILL after `timeout_s`: whether SIGTERM alone stopped it."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return False

    def submit(self, recipe: str, *overrides: str) -> httpx.Response:
        return httpx.post(self.url + "/api/jobs", json={"recipe": recipe, "overrides": list(overrides)}, headers=CLIENT,
                          timeout=300)

    def job_logs(self) -> list[Path]:
        return sorted((self.state / "jobs").glob("*/log.txt"))
