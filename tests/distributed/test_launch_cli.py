"""`trainforge launch` and the distributed flags of `trainforge train`, through the CLI."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from trainforge.cli import main
from trainforge.launch.torchrun import torchrun_args
from trainforge.errors import UserError


def cli(args, capsys):
    with pytest.raises(SystemExit) as code:
        main(args)
    captured = capsys.readouterr()
    return code.value.code, captured.out, captured.err


def test_launch_k8s_prints_a_pytorchjob_with_the_embedded_recipe(capsys):
    code, out, _ = cli(["launch", "k8s", "digits_cnn", "train.epochs=3", "--nodes", "2", "--gpus-per-node", "4"], capsys)
    assert code in (0, None)
    docs = list(yaml.safe_load_all(out))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["ConfigMap", "PyTorchJob"]
    recipe = yaml.safe_load(next(iter(docs[0]["data"].values())))
    assert recipe["train"]["epochs"] == 3
    assert docs[1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1


def test_launch_slurm_to_a_file_passes_bash_n_and_never_overwrites(tmp_path, capsys):
    target = tmp_path / "job.sbatch"
    code, _, _ = cli(["launch", "slurm", "--nodes", "2", "--env", "NCCL_DEBUG=INFO", "--out", str(target)], capsys)
    assert code in (0, None)
    assert subprocess.run(["bash", "-n", str(target)]).returncode == 0
    text = target.read_text()
    assert "--nnodes 2" in text or "--nnodes=2" in text or "--nnodes '2'" in text
    assert "NCCL_DEBUG" in text
    code, _, err = cli(["launch", "slurm", "--out", str(target)], capsys)
    assert code == 2 and "exists" in err and target.read_text() == text


def test_launch_skypilot_parses(capsys):
    code, out, _ = cli(["launch", "skypilot", "charlm_gpt", "--nodes", "2", "--accelerator", "A100"], capsys)
    assert code in (0, None)
    task = yaml.safe_load(out)
    assert task["num_nodes"] == 2 and "A100" in str(task["resources"]["accelerators"])
    assert subprocess.run(["bash", "-n"], input=task["run"], text=True).returncode == 0


@pytest.mark.parametrize("args,field", [
    (["launch", "slurm", "--nodes", "0"], "--nodes"),
    (["launch", "k8s", "--min-nodes", "3", "--max-nodes", "2"], "--min-nodes"),
    (["launch", "pbs"], "unknown launcher"),
    (["launch", "slurm", "--env", "NOEQUALS"], "--env"),
    (["train", "--nproc-per-node", "0"], "--nproc-per-node"),
    (["train", "--nproc-per-node", "2", "--nnodes", "2"], "--rdzv-endpoint"),
    (["train", "--nproc-per-node", "2", "--nnodes", "3:2", "--rdzv-endpoint", "h:1"], "--nnodes"),
])
def test_bad_distributed_options_exit_2(args, field, capsys, tmp_path):
    if args[0] == "train":
        args = [*args, "--run-dir", str(tmp_path / "run")]
    code, _, err = cli(args, capsys)
    assert code == 2 and field in err and "Traceback" not in err


@pytest.mark.parametrize("node_id, is_host", [("0", "true"), ("1", "false")])
def test_under_srun_the_first_node_hosts_the_rendezvous(monkeypatch, node_id, is_host):
    monkeypatch.setenv("SLURM_NODEID", node_id)
    args = torchrun_args(["x"], nproc_per_node=1, nnodes="1:2", rdzv_endpoint="10.0.0.1:29500", max_restarts=3,
                         run_id="r")
    assert f"--rdzv-conf=is_host={is_host}" in args
    single = torchrun_args(["x"], nproc_per_node=2, nnodes="1", rdzv_endpoint=None, max_restarts=0, run_id="r")
    assert not [a for a in single if a.startswith("--rdzv-conf")]


def test_torchrun_arguments():
    args = torchrun_args(["x"], nproc_per_node=8, nnodes="2:4", rdzv_endpoint="node0:29500", max_restarts=3, run_id="r")
    assert args[:3] == ["--nproc-per-node=8", "--nnodes=2:4", "--max-restarts=3"]
    assert "--rdzv-backend=c10d" in args and "--rdzv-endpoint=node0:29500" in args and "--rdzv-id=r" in args
    assert args[-4:] == ["--module", "trainforge", "train", "x"]
    assert not [a for a in args if a.startswith("--rdzv-conf")]  # outside Slurm: torchrun's own guess
    single = torchrun_args(["x"], nproc_per_node=2, nnodes="1", rdzv_endpoint=None, max_restarts=0, run_id="r")
    assert "--standalone" in single
    with pytest.raises(UserError, match="--max-restarts"):
        torchrun_args(["x"], nproc_per_node=2, nnodes="1", rdzv_endpoint=None, max_restarts=-1, run_id="r")
