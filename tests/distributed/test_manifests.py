"""Cluster job files: each parses, carries the recipe byte for byte, and starts trainforge the right way.

The Slurm script and the SkyPilot run script are executed for real with stand-ins for srun,
scontrol and trainforge on PATH, so quoting, the embedded recipe and the SIGTERM/requeue path are
checked by bash itself, not by string matching.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from trainforge.config import load_config
from trainforge.launch.manifests import LAUNCHERS, JobSpec, k8s_name, launch_text, render
from trainforge.errors import UnknownNameError, UserError

# a value that breaks any unquoted heredoc or careless quoting: $VAR, `cmd`, $(cmd), quotes, backslashes
NASTY = "$HOME/`whoami`/$(id -u) \"double\" 'single' back\\slash"
NASTY_MULTILINE = "first $PATH line\n  indented `date`\nTRAINFORGE is not the delimiter\n"


def _recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.yaml"
    raw = {
        "name": "nasty_run",
        "data": {"source": "digits", "path": NASTY},
        "model": {"name": "mlp", "args": {"note": NASTY_MULTILINE}},
        "train": {"epochs": 2},
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def _spec(**options) -> JobSpec:
    options.setdefault("name", "demo")
    options.setdefault("recipe_text", "name: demo\ntrain:\n  epochs: 1\n")
    return JobSpec(**options)


def _fake_bin(tmp_path: Path, scripts: dict[str, str]) -> dict[str, str]:
    """An environment whose PATH finds the given stand-in commands first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(0o755)
    log = tmp_path / "log"
    log.mkdir(exist_ok=True)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log), "HOME": str(tmp_path / "home")}


FAKE_SRUN = """\
printf '%s\\n' "$@" > "$FAKE_LOG/srun.args"
if [ -n "${FAKE_SRUN_HANG:-}" ]; then
  trap 'echo TERM > "$FAKE_LOG/srun.signal"; exit 143' TERM
  touch "$FAKE_LOG/srun.started"
  while :; do sleep 0.05; done
fi
"""
FAKE_SCONTROL = """\
case "$1" in
  show) printf 'node-a\\nnode-b\\n' ;;
  requeue) echo "$2" > "$FAKE_LOG/requeued" ;;
esac
"""
FAKE_TRAINFORGE = """printf '%s\\n' "$@" > "$FAKE_LOG/trainforge.args"\n"""


def _bash_syntax_ok(script: str, tmp_path: Path) -> None:
    path = tmp_path / "syntax-check.sh"
    path.write_text(script)
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _args_after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# ------------------------------------------------------------------ slurm


@pytest.mark.parametrize("nodes", [dict(nodes=1), dict(nodes=2), dict(nodes=2, min_nodes=1, max_nodes=4)])
def test_slurm_script_is_valid_bash(nodes, tmp_path):
    _bash_syntax_ok(render("slurm", _spec(**nodes, env={"NCCL_DEBUG": "INFO"})), tmp_path)


def test_slurm_directives():
    text = render("slurm", _spec(nodes=4, gpus_per_node=4, cpus_per_gpu=6, partition="gpu",
                                 time_limit="24:00:00", mem_per_node_gib=512))  # fmt: skip
    directives = re.findall(r"^#SBATCH (\S+)$", text, flags=re.M)
    assert directives[:5] == ["--job-name=demo", "--nodes=4", "--ntasks-per-node=1", "--gpus-per-node=4",
                              "--cpus-per-task=24"]  # fmt: skip
    for expected in ("--partition=gpu", "--time=24:00:00", "--mem=512G", "--requeue", "--signal=B:TERM@120"):
        assert expected in directives
    assert text.startswith("#!/bin/bash\n")

    plain = render("slurm", _spec())
    assert "--partition" not in plain and "--time" not in plain and "--mem" not in plain
    elastic = render("slurm", _spec(nodes=3, min_nodes=2, max_nodes=4))
    # starts on --nodes, keeps its allocation when a node fails (--no-kill): torchrun goes on within 2:4
    assert "#SBATCH --nodes=3\n" in elastic and "#SBATCH --no-kill\n" in elastic and "srun --no-kill" in elastic
    assert "--nnodes 2:4" in elastic and "--no-kill" not in plain


def test_slurm_script_writes_recipe_byte_for_byte_and_starts_torchrun(tmp_path):
    text = launch_text("slurm", str(_recipe(tmp_path)), ["train.epochs=3"], nodes=2,
                       run_dir=str(tmp_path / "shared" / "{name}"), env={"NCCL_DEBUG": "INFO"})  # fmt: skip
    expected = load_config(str(_recipe(tmp_path)), ["train.epochs=3"]).to_yaml()
    script = tmp_path / "job.sh"
    script.write_text(text)
    env = _fake_bin(tmp_path, {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL})
    env.update(SLURM_JOB_NODELIST="node-[a-b]", SLURM_JOB_ID="77")

    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=20)

    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "shared" / "nasty_run"
    assert (run_dir / "job-config.yaml").read_bytes() == expected.encode()
    args = (tmp_path / "log" / "srun.args").read_text().splitlines()
    assert args[:5] == ["--ntasks-per-node=1", "--cpus-per-task=64", "trainforge", "train",
                        str(run_dir / "job-config.yaml")]  # fmt: skip
    assert _args_after(args, "--run-dir") == str(run_dir)
    assert _args_after(args, "--resume") == "auto"
    assert _args_after(args, "--nproc-per-node") == "8"
    assert _args_after(args, "--nnodes") == "2"
    assert _args_after(args, "--rdzv-endpoint") == "node-a:29500"  # the first host of the allocation
    assert _args_after(args, "--max-restarts") == "3"
    assert not (tmp_path / "log" / "requeued").exists()


def test_slurm_sigterm_reaches_srun_and_requeues(tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(render("slurm", _spec(run_dir=str(tmp_path / "run"))))
    env = _fake_bin(tmp_path, {"srun": FAKE_SRUN, "scontrol": FAKE_SCONTROL})
    env.update(SLURM_JOB_NODELIST="node-a", SLURM_JOB_ID="4242", FAKE_SRUN_HANG="1")
    log = tmp_path / "log"

    # own session, so cleanup can reach the srun stand-in too; the SIGTERM below goes to bash only
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while not (log / "srun.started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "srun stand-in never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)  # what --signal=B:TERM@120 does before the time limit
        proc.wait(timeout=10)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    assert (log / "srun.signal").read_text().strip() == "TERM"  # every rank is told to checkpoint
    assert (log / "requeued").read_text().strip() == "4242"
    assert proc.returncode == 0


def test_slurm_rejects_values_sbatch_would_misread():
    with pytest.raises(UserError, match=r"^--partition: "):
        render("slurm", _spec(partition="gpu --exclusive"))
    with pytest.raises(UserError, match=r"^--time-limit: "):
        render("slurm", _spec(time_limit="1 day"))


def test_slurm_job_name_is_made_safe():
    text = render("slurm", _spec(name="my run; rm -rf /"))
    assert "#SBATCH --job-name=my-run-rm--rf\n" in text


# ------------------------------------------------------------------ kubernetes


def _k8s(spec: JobSpec) -> tuple[dict, dict]:
    docs = list(yaml.safe_load_all(render("k8s", spec)))
    assert [d["kind"] for d in docs] == ["ConfigMap", "PyTorchJob"]
    return docs[0], docs[1]


def test_k8s_configmap_carries_the_recipe_exactly(tmp_path):
    text = launch_text("k8s", str(_recipe(tmp_path)), [], nodes=2)
    config_map, job = yaml.safe_load_all(text)
    assert config_map["data"]["config.yaml"] == load_config(str(_recipe(tmp_path))).to_yaml()
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert pod["containers"][0]["command"][2] == mounts["config"] + "/config.yaml"


def test_k8s_pytorchjob_fields():
    config_map, job = _k8s(_spec(nodes=3, gpus_per_node=4, env={"NCCL_DEBUG": "INFO"}, pvc="team-runs"))
    assert job["apiVersion"] == "kubeflow.org/v1"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    assert "elasticPolicy" not in job["spec"]
    for role in ("Master", "Worker"):
        assert replicas[role]["restartPolicy"] == "OnFailure"
        pod = replicas[role]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["name"] == "pytorch"
        assert container["image"] == "trainforge:latest"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert {"name": "NCCL_DEBUG", "value": "INFO"} in container["env"]
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
        command = container["command"]
        assert command[:2] == ["trainforge", "train"]
        assert all(isinstance(word, str) for word in command)  # Kubernetes wants strings
        assert _args_after(command, "--rdzv-endpoint") == "$(MASTER_ADDR):$(MASTER_PORT)"
        assert _args_after(command, "--nnodes") == "3"
        assert _args_after(command, "--nproc-per-node") == "4"
        assert _args_after(command, "--resume") == "auto"
        assert _args_after(command, "--run-dir") == "/runs/demo"
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"} and mounts["dshm"] == "/dev/shm"
        assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == "team-runs"
        assert mounts["runs"] == "/runs"


def test_k8s_single_node_has_no_worker():
    _, job = _k8s(_spec(nodes=1))
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}


def test_k8s_elastic_policy():
    _, job = _k8s(_spec(nodes=2, min_nodes=1, max_nodes=4, max_restarts=7))
    policy = job["spec"]["elasticPolicy"]
    assert policy["rdzvBackend"] == "c10d"
    assert (policy["minReplicas"], policy["maxReplicas"], policy["maxRestarts"]) == (1, 4, 7)
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert _args_after(command, "--nnodes") == "1:4"


@pytest.mark.parametrize("name", ["digits_cnn", "GPT2 Small", "7up", "x" * 80, "__"])
def test_k8s_names_are_dns_labels(name):
    config_map, job = _k8s(_spec(name=name))
    for value in (job["metadata"]["name"], config_map["metadata"]["name"]):
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", value) and len(value) <= 63, value
    assert len(k8s_name(name) + "-worker-999") <= 63


# ------------------------------------------------------------------ skypilot


def test_skypilot_task_fields(tmp_path):
    task = yaml.safe_load(render("skypilot", _spec(nodes=2, gpus_per_node=4, accelerator="A100", env={"A": "1"})))
    assert task["name"] == "demo" and task["num_nodes"] == 2
    assert task["resources"]["accelerators"] == "A100:4"
    assert "use_spot" not in task["resources"] and "file_mounts" not in task
    assert task["envs"] == {"A": "1"}
    assert task["setup"].strip() == "pip install trainforge"
    _bash_syntax_ok(task["setup"], tmp_path)
    _bash_syntax_ok(task["run"], tmp_path)


def test_a_cpu_only_job_asks_no_engine_for_a_gpu_and_trains_on_the_cpu(tmp_path):
    """--gpus-per-node 0: no GRES line, no nvidia.com/gpu limit, no accelerator; the processes per node and their
    CPUs as given; every target's command adds train.device=cpu and hides the node's GPUs."""
    spec = _spec(gpus_per_node=0, procs_per_node=3, cpus_per_gpu=2)
    slurm = render("slurm", spec)
    assert "--gpus" not in slurm and "#SBATCH --cpus-per-task=6" in slurm
    assert "train.device=cpu" in slurm and "--nproc-per-node 3" in slurm
    assert "export CUDA_VISIBLE_DEVICES=\n" in slurm and "export OMP_NUM_THREADS=2\n" in slurm
    _bash_syntax_ok(slurm, tmp_path)
    _, job = _k8s(spec)
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert "limits" not in container["resources"] and container["resources"]["requests"] == {"cpu": "6"}
    assert "train.device=cpu" in container["command"]
    assert container["command"][container["command"].index("--nproc-per-node") + 1] == "3"
    assert {"name": "CUDA_VISIBLE_DEVICES", "value": ""} in container["env"]
    task = yaml.safe_load(render("skypilot", spec))
    assert "accelerators" not in task["resources"] and task["resources"]["cpus"] == "6+"
    assert "--nproc-per-node 3" in task["run"] and "train.device=cpu" in task["run"]
    _bash_syntax_ok(task["run"], tmp_path)
    # with GPUs the request is there, one process per GPU
    gpu = render("slurm", _spec(gpus_per_node=2, cpus_per_gpu=4))
    assert "#SBATCH --gpus-per-node=2" in gpu and "--nproc-per-node 2" in gpu and "train.device=cpu" not in gpu


def test_skypilot_run_writes_recipe_byte_for_byte_and_starts_torchrun(tmp_path):
    task = yaml.safe_load(launch_text("skypilot", str(_recipe(tmp_path)), [], nodes=2))
    env = _fake_bin(tmp_path, {"trainforge": FAKE_TRAINFORGE})
    env.update(SKYPILOT_NODE_IPS="10.0.0.7\n10.0.0.8\n", SKYPILOT_NUM_NODES="2", SKYPILOT_NUM_GPUS_PER_NODE="8")
    work = tmp_path / "sky_workdir"
    work.mkdir()

    result = subprocess.run(["bash", "-c", task["run"]], env=env, cwd=work, capture_output=True, text=True, timeout=20)

    assert result.returncode == 0, result.stderr
    config = tmp_path / "home" / ".trainforge" / "nasty_run.yaml"
    assert config.read_bytes() == load_config(str(_recipe(tmp_path))).to_yaml().encode()
    args = (tmp_path / "log" / "trainforge.args").read_text().splitlines()
    assert args[:2] == ["train", str(config)]
    assert _args_after(args, "--rdzv-endpoint") == "10.0.0.7:29500"
    assert _args_after(args, "--nnodes") == "2"
    assert _args_after(args, "--nproc-per-node") == "8"
    assert _args_after(args, "--resume") == "auto"
    assert _args_after(args, "--run-dir") == "runs/nasty_run"


def test_skypilot_spot_uses_a_bucket_for_the_run_dir():
    task = yaml.safe_load(render("skypilot", _spec(spot=True, bucket="s3://team/runs")))
    assert task["resources"]["use_spot"] is True
    assert task["file_mounts"] == {"/runs": {"source": "s3://team/runs", "mode": "MOUNT"}}
    assert "--run-dir /runs/demo" in task["run"]
    with pytest.raises(UserError, match=r"^--bucket: "):
        render("skypilot", _spec(spot=True))


def test_skypilot_refuses_an_elastic_range():
    with pytest.raises(UserError, match=r"^--min-nodes: "):
        render("skypilot", _spec(nodes=2, min_nodes=1, max_nodes=4))


# ------------------------------------------------------------------ every target, and bad input


@pytest.mark.parametrize("target", LAUNCHERS.names())
def test_every_target_embeds_recipe_and_resumes(target):
    assert set(LAUNCHERS.names()) == {"slurm", "k8s", "skypilot"}
    text = render(target, _spec(recipe_text="name: demo\nseed: 12345\n"))
    assert "seed: 12345" in text
    assert "--resume" in text and "auto" in text


def test_launch_text_uses_recipe_name_and_overrides(tmp_path):
    text = launch_text("k8s", None, ["name=tiny", "train.epochs=4"], nodes=1, gpus_per_node=None)
    config_map, job = yaml.safe_load_all(text)
    assert job["metadata"]["name"] == "tiny"
    assert yaml.safe_load(config_map["data"]["config.yaml"])["train"]["epochs"] == 4
    command = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    assert _args_after(command, "--nproc-per-node") == "8"  # None means "not given": the default


@pytest.mark.parametrize(
    "options, option",
    [
        (dict(nodes=0), "--nodes"),
        (dict(nodes=2, min_nodes=3, max_nodes=2), "--min-nodes"),
        (dict(nodes=5, min_nodes=1, max_nodes=4), "--nodes"),
        (dict(gpus_per_node=-1), "--gpus-per-node"),
        (dict(procs_per_node=0), "--procs-per-node"),
        (dict(max_restarts=-1), "--max-restarts"),
        (dict(port=70000), "--port"),
        (dict(env={"NOT-VALID": "1"}), "--env"),
        (dict(run_dir="runs/{job}"), "--run-dir"),
        (dict(colour="red"), "--colour"),
    ],
)
def test_bad_options_name_the_option(options, option):
    with pytest.raises(UserError) as err:
        launch_text("slurm", None, [], **options)
    message = str(err.value)
    assert message.startswith(option + ":") and "\n" not in message


def test_unknown_target_lists_valid_targets():
    with pytest.raises(UnknownNameError) as err:
        launch_text("lsf", None, [])
    assert "k8s, skypilot, slurm" in str(err.value)
    assert isinstance(err.value, UserError)


def test_bad_recipe_is_a_user_error():
    with pytest.raises(UserError, match="no such recipe"):
        launch_text("slurm", "no_such_recipe", [])
