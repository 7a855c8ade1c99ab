"""`trainforge launch slurm ... --gpus-per-node 0` against a real Slurm (the `slurm_cluster` fixture): the file it
writes has no GPU request, `sbatch --test-only` accepts it, and submitted as written it trains two CPU processes to
the end: a final model and test metrics in its run directory."""
from __future__ import annotations

import json
import os
import sys
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
    # the same file with a GPU request is refused by this CPU-only cluster: the check is Slurm's, and it can say no
    gpu_file = tmp_path / "gpu.sbatch"
    gpu_file.write_text(text.replace("#SBATCH --cpus-per-task=2", "#SBATCH --gpus-per-node=1\n#SBATCH --cpus-per-task=2"))
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
