"""Elastic membership through the real launcher: two launchers ("nodes") on localhost, `--nnodes 1:2`.

The second joins the running job with the same command (`--resume auto`), the workers checkpoint and
re-rendezvous as two processes; then the second launcher's process group is SIGKILLed (the node leaves)
and the first continues alone from the newest checkpoint to a complete, evaluable final model."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest
from procs import children

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # several processes, or timing: the machine to itself

HERE = str(Path(__file__).resolve().parent)
STEPS = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_rows(run_dir: Path) -> list[dict]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    return [r for r in rows if r.get("split") == "train"]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait(what: str, done: Callable[[], bool], procs: list[subprocess.Popen], deadline: float) -> None:
    while not done():
        for p in procs:
            assert p.poll() is None, f"waiting for {what}: a launcher exited with {p.returncode}"
        assert time.monotonic() < deadline, f"waiting for {what}: timed out"
        time.sleep(0.1)


def test_a_node_joins_a_running_job_and_another_leaves_it(tmp_path):
    run_dir, slow = tmp_path / "run", tmp_path / "slow"
    slow.touch()  # steps take >= 0.2 s per micro-batch until the node has left: the run cannot end before
    cmd = [
        sys.executable, "-m", "trainforge", "train",
        "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "model.name=custom",
        "model.target=launch_models:paced", f"model.args={{slow_while: {slow}, hidden: 32}}",
        "train.global_batch_size=32", "train.micro_batch_size=16", "train.device=cpu", "train.log_every_steps=1",
        "train.early_stopping=null", "schedule.name=constant", "schedule.warmup_steps=0", f"train.max_steps={STEPS}",
        "train.checkpoint_every_steps=5", "log.progress=false", "log.tensorboard=false", "log.report=false",
        "--run-dir", str(run_dir), "--resume", "auto",  # the same command on every node, joining ones too
        "--nproc-per-node", "1", "--nnodes", "1:2", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--max-restarts", "2",
    ]
    # torchrun's own variable for --rdzv-conf: wait 1 s, not 30, for more nodes once the minimum is there, and
    # a node's heartbeat every 1 s, not 5, so the node that left is found gone (3 missed beats) in 3 s, not 15
    env = dict(os.environ, PYTHONPATH=HERE, PET_RDZV_CONF="last_call_timeout=1,keep_alive_interval=1")
    logs = {name: open(tmp_path / f"{name}.err", "w+") for name in ("first", "second")}
    start = time.monotonic()
    deadline = start + 170
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logs["first"], text=True, env=env, start_new_session=True)
    second = None
    try:
        _wait("the first checkpoint", lambda: (run_dir / "checkpoints" / "latest").exists(), [first], deadline)
        second = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=logs["second"], text=True, env=env,
                                  start_new_session=True)
        # two processes: 16 samples each, no accumulation; and a checkpoint written by the pair
        _wait("two processes", lambda: any(r["accumulation"] == 1 for r in _train_rows(run_dir)), [first, second], deadline)
        joined_at = min(r["step"] for r in _train_rows(run_dir) if r["accumulation"] == 1)
        _wait("a checkpoint of the pair", lambda: (run_dir / "checkpoints" / "latest").read_text().strip()
              >= f"step-{joined_at + 5:06d}", [first, second], deadline)
        workers = children(second.pid)
        assert workers
        os.killpg(second.pid, signal.SIGKILL)  # the node leaves: its launcher and everything in its group
        second.wait(timeout=30)
        slow.unlink()
        time.sleep(1)
        assert not any(map(_alive, workers)), "a worker outlived its launcher (torchrun starts it in a session of its own)"
        out, _ = first.communicate(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    elapsed_s = time.monotonic() - start
    logs["first"].seek(0)
    err = logs["first"].read()
    assert first.returncode == 0, err[-4000:]
    assert "run completed" in out

    rows = _train_rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # every step once, across the three groups
    accumulation = [r["accumulation"] for r in rows]
    changes = [a for i, a in enumerate(accumulation) if i == 0 or a != accumulation[i - 1]]
    assert changes == [2, 1, 2], changes  # world size 1 -> 2 -> 1
    assert err.count("resumed at step") == 2
    assert (run_dir / "final" / "model.safetensors").is_file() and (run_dir / "eval.json").is_file()
    evaluated = subprocess.run([sys.executable, "-m", "trainforge", "eval", str(run_dir), "--json"],
                               capture_output=True, text=True, timeout=60, env=env)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert json.loads(evaluated.stdout)["accuracy"] > 0.5
    print(f"joined at step {joined_at}, finished in {elapsed_s:.0f} s")
