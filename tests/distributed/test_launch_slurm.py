"""`trainforge launch slurm ... --gpus-per-node 0` against a real Slurm (the `slurm_cluster` fixture): the file it
writes has no GPU request, `sbatch --test-only` accepts it, and submitted as written it trains two CPU processes to
the end: a final model and test metrics in its run directory."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from trainforge.cli import app


def _launch_file(tmp_path: Path, *extra: str) -> Path:
    out = tmp_path / "job.sbatch"
    result = CliRunner().invoke(app, ["launch", "slurm", "digits_cnn", "train.max_steps=12",
                                      "--gpus-per-node", "0", "--procs-per-node", "2", "--cpus-per-gpu", "1",
                                      "--run-dir", str(tmp_path / "run"), "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return out


def test_a_cpu_only_slurm_file_has_no_gpu_request_and_sbatch_test_only_accepts_it(slurm_cluster, tmp_path):
    text = _launch_file(tmp_path, "--partition", "debug").read_text()
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives and not [d for d in directives if "gpu" in d or "gres" in d], directives
    assert "#SBATCH --cpus-per-task=2" in text and "train.device=cpu" in text and "--nproc-per-node 2" in text
    check = slurm_cluster.run("sbatch", "--test-only", str(tmp_path / "job.sbatch"))
    assert check.returncode == 0, check.stderr
    assert "to start at" in check.stderr and "partition debug" in check.stderr
    # the same file asking for more GPUs than a node has (2) is refused: the check is Slurm's, and it can say no
    gpu_file = tmp_path / "gpu.sbatch"
    gpu_file.write_text(text.replace("#SBATCH --cpus-per-task=2", "#SBATCH --gpus-per-node=3\n#SBATCH --cpus-per-task=2"))
    refused = slurm_cluster.run("sbatch", "--test-only", str(gpu_file))
    assert refused.returncode != 0, refused.stderr


def test_a_cpu_only_slurm_file_runs_two_processes_to_success_under_slurm(slurm_cluster, tmp_path):
    job_file = _launch_file(tmp_path)
    env = {**slurm_cluster.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    submitted = slurm_cluster.run_env(env, "sbatch", "--parsable", f"--output={tmp_path}/slurm-%j.out",
                                      f"--chdir={tmp_path}", str(job_file))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    state = slurm_cluster.wait_job(job_id, timeout_s=300)
    log = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert state == ("COMPLETED", "0:0"), log[-3000:] + slurm_cluster.logs()
    run = tmp_path / "run"
    result = json.loads((run / "eval.json").read_text())
    assert result["split"] == "test" and result["num_samples"] > 0 and result["accuracy"] > 0.3
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("step", 0) for m in metrics) == 12
    ran = json.loads((run / "final" / "model.json").read_text())["ran"]
    assert ran["world_size"] == 2 and ran["device"] == "cpu"


def _submit_file(cluster, job_file: Path, out_dir: Path) -> str:
    env = {**cluster.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    submitted = cluster.run_env(env, "sbatch", "--parsable", f"--output={out_dir}/slurm-%j.out", f"--chdir={out_dir}",
                                str(job_file))
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _losses(run: Path) -> dict[int, float]:
    """Train loss by step; a step logged twice (before a failure and again after the resume) counts as its last."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in rows if r.get("split") == "train"}


def test_a_two_node_slurm_job_survives_losing_a_node_with_the_losses_of_an_uninterrupted_resume(slurm_cluster, tmp_path):
    """Build 4 of issue 30: `--nodes 2 --min-nodes 1` (torchrun --nnodes 1:2; `--no-kill` for sbatch and srun), one
    CPU process a node, on nodes tf1 and tf2. Mid-run the second node dies (its slurmd and every process of its job
    step SIGKILLed). The first node's worker loses its peer, torchrun restarts the worker group on the one node left,
    and it resumes from the newest checkpoint. Its losses after that checkpoint, and its final weights, equal those of
    a one-node run started from a copy of the same checkpoint, to the bit."""
    steps = 300
    common = ["digits_cnn", f"train.max_steps={steps}", "train.checkpoint_every_steps=4", "train.log_every_steps=1",
              "train.eval_every_steps=150", "train.early_stopping=null", "log.progress=false", "data.num_workers=0",
              "train.keep_checkpoints=1000",  # the checkpoint the job resumed from stays, for the reference run
              "--gpus-per-node", "0", "--procs-per-node", "1", "--cpus-per-gpu", "1", "--partition", "debug"]
    run = tmp_path / "run"
    job_file = tmp_path / "two.sbatch"
    result = CliRunner().invoke(app, ["launch", "slurm", *common, "--nodes", "2", "--min-nodes", "1", "--max-nodes", "2",
                                      "--run-dir", str(run), "--out", str(job_file)])
    assert result.exit_code == 0, result.output
    assert "#SBATCH --nodes=2\n" in job_file.read_text() and "--nnodes 1:2" in job_file.read_text()
    job_id = _submit_file(slurm_cluster, job_file, tmp_path)
    latest = run / "checkpoints" / "latest"
    try:
        _wait(lambda: slurm_cluster.job_fields(job_id).get("NodeList") == "tf[1-2]", 120, "the job on both nodes")
        _wait(lambda: latest.exists() and int(latest.read_text().strip().removeprefix("step-")) >= 8, 180,
              "a checkpoint at step 8 or later")
        slurm_cluster.kill_node("tf2")
        state, code = slurm_cluster.wait_job(job_id, timeout_s=400)
        log = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
        assert (state, code) == ("COMPLETED", "0:0"), log[-4000:] + slurm_cluster.logs()
    finally:
        slurm_cluster.start_node("tf2")
        slurm_cluster.wait_idle()
    assert "Node failure on tf2" in log
    resumed = re.findall(r"resumed at step (\d+)", log)
    assert len(resumed) == 1, log[-3000:]
    start = int(resumed[0])
    assert 8 <= start < steps - 20  # the failure came early enough to leave work for the one node
    assert json.loads((run / "final" / "model.json").read_text())["ran"]["world_size"] == 1

    # the reference: one node, from a copy of the checkpoint the job resumed from
    ref = tmp_path / "ref"
    (ref / "checkpoints").mkdir(parents=True)
    shutil.copytree(run / "checkpoints" / f"step-{start:06d}", ref / "checkpoints" / f"step-{start:06d}")
    (ref / "checkpoints" / "latest").write_text(f"step-{start:06d}\n")
    ref_file = tmp_path / "one.sbatch"
    result = CliRunner().invoke(app, ["launch", "slurm", *common, "--nodes", "1", "--run-dir", str(ref),
                                      "--out", str(ref_file)])
    assert result.exit_code == 0, result.output
    ref_id = _submit_file(slurm_cluster, ref_file, tmp_path)
    assert slurm_cluster.wait_job(ref_id, timeout_s=300) == ("COMPLETED", "0:0")
    after, ref_losses = _losses(run), _losses(ref)
    compared = [s for s in ref_losses if s > start]
    assert len(compared) == steps - start
    assert {s: after[s] for s in compared} == {s: ref_losses[s] for s in compared}
    assert (run / "final" / "model.safetensors").read_bytes() == (ref / "final" / "model.safetensors").read_bytes()
