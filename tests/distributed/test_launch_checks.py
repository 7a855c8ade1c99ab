"""Bad input under the launcher: refused before any worker starts, or, found by a worker, never restarted.

Either way `trainforge train --nproc-per-node N` exits 2 with one line, as a single process would."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainforge.cli import main
from trainforge.config import load_config
from trainforge.launch.torchrun import USER_ERROR_FILE, check_run, node_counts
from trainforge.errors import UserError

HERE = str(Path(__file__).resolve().parent)
BASE = [
    "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "model.name=mlp",
    "model.args={hidden: [8], dropout: 0.0}", "train.global_batch_size=32", "train.micro_batch_size=16",
    "train.device=cpu", "train.early_stopping=null", "log.progress=false", "log.tensorboard=false", "log.report=false",
]
ELASTIC = ["--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400"]


@pytest.mark.parametrize("extra,flags,says", [
    (["model.args={hidden: [8], bogus: 1}"], [], "model.args.bogus: unknown argument for model 'mlp'"),
    (["train.global_batch_size=1"], [], "smaller than the world size (2 processes)"),
    (["train.global_batch_size=6"], ELASTIC, "does not split evenly over 4 processes"),
    (["train.micro_batch_size=auto", "train.global_batch_size=6"], ELASTIC, "over 4 processes"),
    (["distributed.strategy=none"], [], "distributed.strategy: none cannot run on 2 processes"),
    (["data.source=csv", "data.path=/nonexistent/rows.csv"], [], "data.path"),
    (["train.early_stopping={metric: perplexity}"], [], "train.early_stopping.metric"),
])
def test_bad_input_is_refused_before_any_worker_starts(extra, flags, says, tmp_path, capsys, monkeypatch):
    def no_workers(args):
        raise AssertionError(f"torchrun was started: {args}")

    monkeypatch.setattr("torch.distributed.run.main", no_workers)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as code:
        main(["train", *BASE, *extra, "--nproc-per-node", "2", *flags, "--run-dir", str(run_dir)])
    err = capsys.readouterr().err
    assert code.value.code == 2, err
    assert says in err and err.startswith("error:") and len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists()


def test_every_node_count_of_an_elastic_range_is_checked():
    assert list(node_counts("2:4")) == [2, 3, 4] and list(node_counts("3")) == [3]
    cfg = load_config(None, [*BASE, "train.global_batch_size=64", "train.micro_batch_size=8"])
    check_run(cfg, nproc_per_node=8, nnodes="1:2")  # 8 and 16 processes: fine
    with pytest.raises(UserError, match=r"over 24 processes.*3 nodes x 8 processes, which --nnodes 2:4 allows"):
        check_run(cfg, nproc_per_node=8, nnodes="2:4")


def test_a_custom_model_that_cannot_run_on_the_meta_device_is_built_for_real(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(HERE)
    cfg = load_config(None, [*BASE, "model.name=custom", "model.target=launch_models:needs_real_tensors",
                             "model.args={}"])
    check_run(cfg, nproc_per_node=2, nnodes="1")


@pytest.mark.serial
@pytest.mark.slow
def test_bad_input_found_by_a_worker_is_not_restarted(tmp_path):
    attempts = tmp_path / "attempts"
    attempts.mkdir()
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainforge", "train", *BASE, "model.name=custom",
           "model.target=launch_models:rejected_by_workers", f"model.args={{attempts: {attempts}}}",
           "train.max_steps=4", "--run-dir", str(run_dir), "--nproc-per-node", "2", "--max-restarts", "3"]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=HERE))
    elapsed_s = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert sorted(p.name for p in attempts.iterdir()) == ["rank0-restart0", "rank1-restart0"]  # one start, no restart
    line = "error: model.args.attempts: refused by the worker (a test model); fix the model and rerun"
    assert proc.stderr.strip().splitlines()[-1] == line
    assert proc.stderr.count("refused by the worker") == 1, proc.stderr  # said once, by the launcher
    assert "--resume auto" not in proc.stderr and "Traceback" not in proc.stderr
    assert (run_dir / USER_ERROR_FILE).read_text().strip() == line.removeprefix("error: ")
    print(f"worker-side bad input: exit 2 after {elapsed_s:.1f} s")


def test_a_node_joining_before_the_first_checkpoint_moves_nothing_aside(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr("torch.distributed.run.main", started.append)  # the workers: not run here
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-000005").mkdir(parents=True)  # being written by the running job
    (run_dir / "config.yaml").write_text(load_config(None, BASE).to_yaml())
    (run_dir / "metrics.jsonl").write_text('{"split": "train", "step": 1, "loss": 2.0}\n')
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    with pytest.raises(SystemExit) as code:
        main(["train", "--run-dir", str(run_dir), "--resume", "auto", "--nproc-per-node", "1",
              "--nnodes", "1:2", "--rdzv-endpoint", "127.0.0.1:29400"])
    assert code.value.code in (0, None), capsys.readouterr().err
    assert len(started) == 1 and "--resume" in started[0]
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # nothing moved to unusable-*


def test_a_torchrun_worker_alone_leaves_starting_over_to_its_launcher(tmp_path, monkeypatch):
    from trainforge.training.api import prepare_run

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints" / "step-000005").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(load_config(None, BASE).to_yaml())
    for name, value in (("TORCHELASTIC_RUN_ID", "r"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(name, value)  # elastic, one node of one process: a group of one
    _, _, ckpt = prepare_run(None, [], run_dir=run_dir, resume="auto")
    assert ckpt is None and (run_dir / "checkpoints" / "step-000005").is_dir()
    assert not list(run_dir.glob("unusable-*"))
