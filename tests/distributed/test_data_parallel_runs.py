"""Multi-process training on the CPU with gloo, through the real launcher (torchrun).

Equivalence with one process, resuming across world sizes, out-of-memory agreed by all ranks, a worker
SIGKILLed and restarted, and SIGTERM to the launcher (preemption)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import children
import torch
from safetensors.torch import load_file

import trainforge

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # several processes, or timing: the machine to itself

LOOP_MODELS = str(Path(__file__).resolve().parents[1] / "training")
BASE = [
    "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "model.name=mlp",
    "model.args={hidden: [32], dropout: 0.0}", "train.global_batch_size=32", "train.device=cpu",
    "train.log_every_steps=1", "train.early_stopping=null", "schedule.name=constant", "schedule.warmup_steps=0",
    "train.deterministic=true",
    "log.progress=false", "log.tensorboard=false", "log.report=false",
]


def command(run_dir: Path, *extra: str, nproc: int = 1, micro: int = 32, restarts: int = 0) -> list[str]:
    cmd = [sys.executable, "-m", "trainforge", "train", *BASE, f"train.micro_batch_size={micro}", *extra,
           "--run-dir", str(run_dir)]
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc), "--max-restarts", str(restarts)]
    return cmd


def run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=LOOP_MODELS)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def here(run_dir: Path, *extra: str, micro: int = 32, resume: str | None = None):
    """A one-process run in this process: what `command(...)` without --nproc-per-node runs, less the start of
    a Python process (the CLI's path is tested elsewhere; here only the launcher's groups need processes)."""
    cfg = trainforge.load_config(None, [*BASE, f"train.micro_batch_size={micro}", *extra])
    return trainforge.train(cfg, run_dir=run_dir, resume=resume)


def train_losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    steps = [r["step"] for r in train]
    assert steps == sorted(set(steps)), "one voice: every step logged once"
    return [r["loss"] for r in train]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


def test_two_processes_match_one_process_with_twice_the_micro_batch(tmp_path):
    here(tmp_path / "one", "train.max_steps=20", micro=32)
    run(command(tmp_path / "two", "train.max_steps=20", nproc=2, micro=16))
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(two) == 20
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5
    assert not (tmp_path / "two" / "two").exists() and len(list(tmp_path.iterdir())) == 2  # one run directory


def test_a_checkpoint_from_two_processes_resumes_on_one_and_back(tmp_path):
    here(tmp_path / "ref1", "train.max_steps=12", micro=16)
    run(command(tmp_path / "a", "train.max_steps=6", nproc=2, micro=16))
    here(tmp_path / "a", "train.max_steps=12", micro=16, resume="auto")
    assert max(abs(x - y) for x, y in zip(train_losses(tmp_path / "ref1"), train_losses(tmp_path / "a"))) < 1e-5
    here(tmp_path / "b", "train.max_steps=6", micro=16)
    run(command(tmp_path / "b", "train.max_steps=12", nproc=2, micro=16) + ["--resume", "auto"])
    assert max(abs(x - y) for x, y in zip(train_losses(tmp_path / "ref1"), train_losses(tmp_path / "b"))) < 1e-5


def test_out_of_memory_on_one_rank_never_leaves_another_waiting(tmp_path):
    """Rank 1 runs out of memory. In a forward pass (before the step's agreement) all ranks shrink the
    micro-batch in place and retry the step. Inside the backward whose all-reduce rank 0 is already in, no
    agreement is possible: rank 1 asks for a restart with a smaller micro-batch and fails, torchrun ends rank
    0 and restarts both. Either way the run equals one planned with micro-batch 8 from the start."""
    common = ["model.name=custom", "train.max_steps=4", "train.checkpoint_every_steps=2"]
    forward = run(command(tmp_path / "forward", *common, "model.target=loop_models:oom_on_rank",
                          "model.args={rank: 1, limit: 8}", nproc=2, micro=16))
    assert "micro-batch -> 8" in forward.stderr and "restart" not in forward.stderr
    backward = run(command(tmp_path / "backward", *common, "model.target=loop_models:oom_in_backward_on_rank",
                           "model.args={rank: 1, limit: 8}", nproc=2, micro=16, restarts=1))
    assert "out of memory at step 1 under DDP with micro-batch 16" in backward.stderr
    assert not (tmp_path / "backward" / "oom_restart.json").exists()  # consumed by the restarted group
    ran = json.loads((tmp_path / "backward" / "final" / "model.json").read_text())["ran"]
    assert ran["micro_batch_size"] == 8 and "before the group restarted" in ran["reasons"]["micro_batch_size"]
    # the two test models are one architecture from one seed; the reference never runs out of memory
    run(command(tmp_path / "plain", *common, "model.target=loop_models:oom_on_rank", "model.args={rank: 1, limit: 1000}",
                nproc=2, micro=8))
    plain = weights(tmp_path / "plain")
    for name in ("forward", "backward"):
        got = weights(tmp_path / name)
        assert all(torch.equal(got[k], plain[k]) for k in plain), name


def _wait_for_checkpoint(run_dir: Path, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not (run_dir / "checkpoints" / "latest").exists():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)


def test_a_killed_worker_is_restarted_and_the_run_ends_as_if_nothing_happened(tmp_path):
    steps = ["train.max_steps=60", "train.checkpoint_every_steps=5", "model.args={hidden: [256, 256], dropout: 0.1}"]
    run(command(tmp_path / "ref", *steps, nproc=2, micro=16))
    env = dict(os.environ, PYTHONPATH=LOOP_MODELS)
    proc = subprocess.Popen(command(tmp_path / "run", *steps, nproc=2, micro=16, restarts=1),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _wait_for_checkpoint(tmp_path / "run", proc)
    workers = children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "resumed at step" in err
    a, b = weights(tmp_path / "ref"), weights(tmp_path / "run")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_signal_after_the_steps_agreement_stops_all_ranks_at_the_next_step(tmp_path):
    """SIGTERM reaches rank 0 alone, inside the backward of step 3: after the ranks agreed that step 3 goes on.
    Acting on it at once would send rank 0 into the checkpoint's collectives while rank 1 waits in step 4's
    agreement. Both must instead stop together after step 4, checkpoint it and exit 0."""
    steps = ["model.name=custom", "model.target=loop_models:sigterm_in_backward_on_rank", "model.args={rank: 0, call: 3}",
             "train.max_steps=8", "train.checkpoint_every_steps=100"]
    run(command(tmp_path / "run", *steps, nproc=2, micro=16), timeout=120)
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000004"
    assert not (tmp_path / "run" / "final").exists()


def test_sigterm_to_the_launcher_checkpoints_all_ranks_and_exits_0(tmp_path):
    steps = ["train.max_steps=400", "train.checkpoint_every_steps=50", "model.args={hidden: [256, 256], dropout: 0.0}"]
    env = dict(os.environ, PYTHONPATH=LOOP_MODELS)
    proc = subprocess.Popen(command(tmp_path / "run", *steps, nproc=2, micro=16),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "metrics.jsonl").exists() or "\"step\": 3," not in (tmp_path / "run" / "metrics.jsonl").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text().strip()
    stopped_at = int(latest.removeprefix("step-"))
    assert 0 < stopped_at < 400 and not (tmp_path / "run" / "final").exists()
    resumed = run(command(tmp_path / "run", *steps, micro=32) + ["--resume", "auto", "--json"])
    assert json.loads(resumed.stdout)["steps"] == 400


GPT = ["model.name=gpt", "model.args={n_layer: 2, n_head: 2, n_embd: 32, dropout: 0.0}", "data.source=synthetic_text",
       "data.args={task: lm, num_samples: 400, seq_len: 32, vocab_size: 64}", "data.normalize=none"]


def test_fsdp_keeps_ema_and_best_weights_and_resumes_on_one_process_and_back(tmp_path):
    """2 processes x micro-batch 4 under FSDP match 1 process x 8 (train losses within 1e-5), with EMA and early
    stopping: their weights are shards in the checkpoint (loaded on one process whole), whole tensors loaded
    into shards the other way, gathered for the final model; each path ends with the final (best, EMA)
    weights and best step of the one-process run."""
    kept = [*GPT, "train.ema_decay=0.8", "train.eval_every_steps=2",
            "train.early_stopping={metric: loss, mode: min, patience: 100}"]
    here(tmp_path / "ref", *kept, "train.max_steps=10", micro=8)
    run(command(tmp_path / "a", *kept, "train.max_steps=5", "distributed.strategy=fsdp", nproc=2, micro=4))
    assert (tmp_path / "a" / "checkpoints" / "step-000005" / ".metadata").exists()  # sharded (DCP)
    state = torch.load(tmp_path / "a" / "checkpoints" / "step-000005" / "state.pt", weights_only=True)
    assert state["sharded_groups"] == ["best_model", "ema"] and state["ema"] == {} and state["best_model"] == {}
    here(tmp_path / "a", *kept, "train.max_steps=10", "distributed.strategy=none", micro=8, resume="auto")
    here(tmp_path / "b", *kept, "train.max_steps=5", micro=8)
    run(command(tmp_path / "b", *kept, "train.max_steps=10", "distributed.strategy=fsdp", nproc=2, micro=4)
        + ["--resume", "auto"])
    ref = weights(tmp_path / "ref")
    best_step = json.loads((tmp_path / "ref" / "final" / "model.json").read_text())["step"]
    assert 0 < best_step <= 10
    for resumed in ("a", "b"):
        assert max(abs(x - y) for x, y in zip(train_losses(tmp_path / "ref"), train_losses(tmp_path / resumed))) < 1e-5
        assert json.loads((tmp_path / resumed / "final" / "model.json").read_text())["step"] == best_step
        other = weights(tmp_path / resumed)
        assert all(torch.allclose(ref[k], other[k], atol=1e-5) for k in ref), resumed


def test_fsdp_out_of_memory_on_one_rank_restarts_the_group_smaller(tmp_path):
    model = ["model.name=custom", "model.target=loop_models:oom_on_rank", "data.source=digits", "data.normalize=zscore"]
    fsdp = ["distributed.strategy=fsdp", "train.max_steps=4"]
    proc = run(command(tmp_path / "oom", *model, "model.args={rank: 1, limit: 8}", *fsdp, nproc=2, micro=16, restarts=1))
    # the restart ran with micro-batch 8; the request was consumed by the next checkpoint, which records it
    assert not (tmp_path / "oom" / "oom_restart.json").exists()
    assert json.loads((tmp_path / "oom" / "final" / "model.json").read_text())["ran"]["micro_batch_size"] == 8
    rows = [json.loads(line) for line in (tmp_path / "oom" / "metrics.jsonl").read_text().splitlines()]
    assert {r["micro_batch_size"] for r in rows if r["split"] == "train"} == {8}
    run(command(tmp_path / "plain", *model, "model.args={rank: 1, limit: 1000}", *fsdp, nproc=2, micro=8))
    assert max(abs(x - y) for x, y in zip(train_losses(tmp_path / "oom"), train_losses(tmp_path / "plain"))) < 1e-6
    assert "out of memory at step 1 under FSDP" in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_nccl_ddp_on_two_gpus_matches_one_gpu(tmp_path):
    gpu = ["train.device=auto", "train.precision=fp32"]
    run(command(tmp_path / "one", *gpu, "train.max_steps=20", micro=32))
    run(command(tmp_path / "two", *gpu, "train.max_steps=20", nproc=2, micro=16))
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-4
