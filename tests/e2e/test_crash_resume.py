"""A real run, SIGKILLed at random moments and resumed each time, ends bit-identical to an uninterrupted one;
SIGTERM saves a checkpoint and exits 0."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest
import torch
from safetensors.torch import load_file

import trainforge

pytestmark = pytest.mark.serial  # several processes, or timing: the machine to itself

OVERRIDES = [
    "train.epochs=8",
    "train.checkpoint_every_steps=4",
    "train.early_stopping=null",
    "train.deterministic=true",
    "train.num_threads=1",
    "log.progress=false",
]


def launch(run_dir: Path, overrides: Sequence[str] = OVERRIDES, env: Optional[dict] = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainforge", "train", *overrides, "--run-dir", str(run_dir), "--resume", "auto"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )


def kill_and_resume(start: Callable[[], subprocess.Popen], run_dir: Path, *, kills: int, seed: int,
                    pause_s: float) -> int:
    """Start the run, SIGKILL it up to `kills` times, each a random moment (0..pause_s) after a new checkpoint,
    start it again each time (it resumes), and let the last start finish; returns the kills made."""
    rng, made = random.Random(seed), 0
    while True:
        proc = start()
        if made < kills and wait_for_progress(proc, run_dir):
            time.sleep(rng.uniform(0.0, pause_s))  # somewhere in a step, an evaluation or a checkpoint write
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                made += 1
                continue
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
        return made


def latest_step(run_dir: Path) -> int:
    try:
        return int((run_dir / "checkpoints" / "latest").read_text().strip().removeprefix("step-"))
    except (OSError, ValueError):
        return -1


def wait_for_progress(proc: subprocess.Popen, run_dir: Path, timeout_s: float = 120) -> bool:
    """Block until the run writes a checkpoint newer than the one it resumed from; False if it ended."""
    start_step = latest_step(run_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if latest_step(run_dir) > start_step:
            return True
        time.sleep(0.02)
    raise AssertionError("the run made no progress")


def assert_killed_run_matches_uninterrupted(recipe: str, args: Sequence[str], tmp_path: Path, *, steps: int) -> None:
    """The recipe with `args` run uninterrupted in this process, and through the CLI SIGKILLed twice (a random moment
    after a new checkpoint) and resumed: the same weights, the same `steps` per-step losses, the same eval.json."""
    import json

    from trainforge.metrics_file import read_metrics

    reference = tmp_path / "reference"
    assert trainforge.train(trainforge.load_config(recipe, list(args)), run_dir=reference).status == "completed"
    run = tmp_path / "killed"
    made = kill_and_resume(lambda: launch(run, [recipe, *args]), run, kills=2, seed=28, pause_s=0.5)
    assert made >= 1
    assert_bit_identical(reference, run)  # every weight and buffer (BatchNorm statistics too)
    losses = [[r["loss"] for r in read_metrics(d / "metrics.jsonl") if r["split"] == "train"] for d in (reference, run)]
    assert losses[0] == losses[1] and len(losses[0]) == steps
    assert json.loads((run / "eval.json").read_text()) == json.loads((reference / "eval.json").read_text())


def two_process_losses(recipe: str, one: Sequence[str], two: Sequence[str], tmp_path: Path) -> list[list[float]]:
    """The per-step training losses of the recipe run in this process with `one`, and in 2 processes
    (--nproc-per-node 2) with `two`."""
    from trainforge.metrics_file import read_metrics

    assert trainforge.train(trainforge.load_config(recipe, list(one)), run_dir=tmp_path / "one").status == "completed"
    done = subprocess.run([sys.executable, "-m", "trainforge", "train", recipe, *two, "--run-dir",
                           str(tmp_path / "two"), "--nproc-per-node", "2"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [[r["loss"] for r in read_metrics(d / "metrics.jsonl") if r["split"] == "train"]
            for d in (tmp_path / "one", tmp_path / "two")]


def assert_bit_identical(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "final" / "model.safetensors")), load_file(str(b / "final" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_matches_uninterrupted(tmp_path: Path):
    reference = tmp_path / "reference"  # uninterrupted, in this process: the same config the CLI loads
    assert trainforge.train(trainforge.load_config(None, OVERRIDES), run_dir=reference).status == "completed"

    run = tmp_path / "killed"
    assert kill_and_resume(lambda: launch(run), run, kills=4, seed=20261129, pause_s=0.4) >= 3
    assert_bit_identical(reference, run)
    assert (run / "eval.json").exists() and (run / "report.html").exists()
    assert not list((run / "checkpoints").glob(".tmp-*")), "leftover temp checkpoint directories"


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_0(tmp_path: Path):
    run = tmp_path / "run"
    proc = launch(run)
    assert wait_for_progress(proc, run)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    err = proc.stderr.read()
    assert "SIGTERM: checkpoint saved at step" in err
    stopped_at = latest_step(run)
    assert f"checkpoint saved at step {stopped_at};" in err
    assert not (run / "final").exists()
    result = trainforge.train(None, run_dir=run, resume="auto")
    assert result.status == "completed" and result.steps > stopped_at
