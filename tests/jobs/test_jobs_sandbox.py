"""The fence around a job of the server (jobs/sandbox.py: Landlock), attacked from inside it: another job's files and
folders outside every root overwritten, truncated, renamed, removed or read; the server's environment read through
/proc; the server signalled. And what a job inherits from the server's environment (jobs/environment.py)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs_helpers import landlock_missing, make_service
from trainforge.errors import UserError
from trainforge.jobs import runner
from trainforge.jobs import sandbox
from trainforge.jobs.environment import parse_tracking_allow, uri_allowed
from trainforge.layout import JobDir

SECRETS = {"MLFLOW_TRACKING_USERNAME": "op-user-321", "MLFLOW_TRACKING_PASSWORD": "op-password-123",
           "MLFLOW_TRACKING_TOKEN": "op-token-456", "AWS_SECRET_ACCESS_KEY": "aws-secret-789",
           "HF_TOKEN": "hf-token-000", "DATABASE_URL_PASSWORD": "db-pass", "TRAINFORGE_TOKEN": "api-token"}

pytestmark = pytest.mark.skipif(bool(landlock_missing()), reason=landlock_missing() or "-")


def tree_digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under `folder` (and the names of its folders): what "untouched" means."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        found[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "<dir>"
    return found


def fenced(policy: sandbox.Policy, code: str, *args: str, env: dict, cwd: Path) -> dict:
    """Run `code` (which prints one JSON document) in a child inside `policy`'s fence, as the wrapper starts a job."""
    out = subprocess.run([sys.executable, "-c", code, *args], preexec_fn=sandbox.preexec(policy), env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


ATTEMPTS = """
import json, os, signal, sys
victim, outside, data, mine, server = sys.argv[1:6]
results = {}
def attempt(name, action):
    try:
        action()
        results[name] = "done"
    except OSError as e:
        results[name] = e.errno
def write(path, text="attacker"):
    with open(path, "w") as f:
        f.write(text)
def read(path):
    with open(path, "rb") as f:
        f.read()
attempt("write own run dir", lambda: write(f"{mine}/run/eval.json"))
attempt("write own temp dir", lambda: write(f"{mine}/tmp/scratch"))
attempt("overwrite victim eval.json", lambda: write(f"{victim}/run/eval.json"))
attempt("create in victim run dir", lambda: write(f"{victim}/run/forged.json"))
attempt("truncate victim config", lambda: os.truncate(f"{victim}/run/config.yaml", 0))
attempt("rename victim file", lambda: os.rename(f"{victim}/run/eval.json", f"{victim}/run/old.json"))
attempt("move victim file into own dir", lambda: os.rename(f"{victim}/run/eval.json", f"{mine}/run/stolen.json"))
attempt("remove victim file", lambda: os.unlink(f"{victim}/run/config.yaml"))
attempt("link into victim dir", lambda: os.symlink("/etc/passwd", f"{victim}/run/link"))
attempt("write own job.yaml", lambda: write(f"{mine}/job.yaml"))
attempt("write outside every root", lambda: write(f"{outside}/dropped.txt"))
attempt("mkdir outside", lambda: os.mkdir(f"{outside}/made"))
attempt("read the data root", lambda: read(f"{data}/rows.csv"))
attempt("read own job.yaml", lambda: read(f"{mine}/job.yaml"))
attempt("read victim eval.json", lambda: read(f"{victim}/run/eval.json"))
attempt("read outside", lambda: read(f"{outside}/secret.txt"))
attempt("read the server's environment", lambda: read(f"/proc/{server}/environ"))
attempt("read the server's memory map", lambda: read(f"/proc/{server}/maps"))
attempt("signal the server", lambda: os.kill(int(server), 0))
import torch  # the software itself stays readable, and torch works
results["torch"] = float(torch.ones(3).sum())
print(json.dumps(results))
"""


def job_dirs(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    state = tmp_path / "state" / "jobs"
    victim, mine = state / "1", state / "2"
    for job in (victim, mine):
        (job / "run").mkdir(parents=True)
        (job / "tmp").mkdir()
        (job / "job.yaml").write_text("name: job\n")
    (victim / "run" / "eval.json").write_text('{"split": "test", "accuracy": 0.97}\n')
    (victim / "run" / "config.yaml").write_text("name: victim\n")
    outside, data = tmp_path / "outside", tmp_path / "data"
    outside.mkdir()
    data.mkdir()
    (outside / "secret.txt").write_text("not for jobs\n")
    (data / "rows.csv").write_text("a,label\n1,0\n")
    return victim, mine, outside, data


def test_a_fenced_job_writes_only_its_run_and_temp_folders_and_reads_only_what_it_may(tmp_path):
    victim, mine, outside, data = job_dirs(tmp_path)
    before = {p: tree_digest(p) for p in (victim, outside)}
    policy = sandbox.job_policy(run_dir=mine / "run", tmp_dir=mine / "tmp", job_dir=mine, data_roots=[data],
                                caches=[])
    env = {"PATH": os.environ["PATH"], "HOME": str(mine / "tmp"), "TMPDIR": str(mine / "tmp"),
           "SERVER_SECRET": "hunter2"}
    results = fenced(policy, ATTEMPTS, str(victim), str(outside), str(data), str(mine), str(os.getpid()), env=env,
                     cwd=mine)
    assert results["write own run dir"] == results["write own temp dir"] == results["read the data root"] == "done"
    assert results["read own job.yaml"] == "done" and results["torch"] == 3.0
    denied = ["overwrite victim eval.json", "create in victim run dir", "truncate victim config", "rename victim file",
              "move victim file into own dir", "remove victim file", "link into victim dir", "write own job.yaml",
              "write outside every root", "mkdir outside", "read victim eval.json", "read outside",
              "read the server's environment", "read the server's memory map"]
    if sandbox.landlock_abi() >= sandbox.SIGNAL_SCOPE_ABI:
        denied.append("signal the server")
    for name in denied:
        assert results[name] != "done", (name, results)
    assert {p: tree_digest(p) for p in (victim, outside)} == before


def test_the_wrapper_never_starts_the_trainer_without_its_fence(tmp_path):
    paths = JobDir(tmp_path)  # no sandbox.json: the fence cannot be built
    marker = tmp_path / "ran"
    argv = runner.wrapped_argv(sys.executable, paths, 1, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 126 and runner.read_exit(paths, 1) == 126
    assert not marker.exists()
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("sandbox: the job cannot be fenced")


def test_jobs_run_inside_the_fence_the_server_writes_for_them(tmp_path):
    service = make_service(tmp_path, data_roots=[])
    paths = service.paths(7)
    policy = service.policy(paths)
    assert str(paths.run) in policy.write and str(paths.tmp) in policy.write
    assert str(paths.path) in policy.read and str(paths.path) not in policy.write
    assert not any(str(service.state_dir) == p or p.startswith(str(service.state_dir / "jobs") + "/") and
                   not p.startswith(str(paths.path)) for p in (*policy.read, *policy.write))
    argv = runner.wrapped_argv(sys.executable, paths, 1, ["true"], sandboxed=service.sandboxed)
    assert argv[argv.index("--sandbox") + 1] == str(paths.sandbox)


def test_without_landlock_the_server_refuses_to_start_unless_told_to_run_jobs_unfenced(tmp_path, monkeypatch, capsys):
    from test_jobs_cli import cli, served_by

    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 2)  # Linux 5.19: no truncate rule, so no fence
    with pytest.raises(UserError, match="--unsandboxed-jobs: this kernel .* has Landlock ABI 2; fencing jobs needs ABI 3"):
        make_service(tmp_path, sandboxed=True)
    code, out, err = cli(capsys, "server", "--state-dir", str(tmp_path / "s"), "--gpus", "cpu:1")
    assert code == 2 and out == "" and err.count("\n") == 1 and "--unsandboxed-jobs" in err
    assert not (tmp_path / "s").exists()  # refused before anything was created
    service, err = served_by(capsys, monkeypatch, tmp_path, "--unsandboxed-jobs")
    assert service.sandboxed is False and "jobs run UNFENCED" in err and "sandbox: off" in err
    assert "--sandbox" not in runner.wrapped_argv(sys.executable, service.paths(1), 1, ["true"], service.sandboxed)


def test_with_landlock_the_server_says_what_the_fence_covers(tmp_path, monkeypatch, capsys):
    from test_jobs_cli import served_by

    service, err = served_by(capsys, monkeypatch, tmp_path, "--unsandboxed-jobs")  # the flag changes nothing here
    assert service.sandboxed is True and f"sandbox: Landlock ABI {sandbox.landlock_abi()}" in err
    assert "UNFENCED" not in err


# ---------------------------------------------------------------- what a job inherits


def test_a_job_inherits_an_allow_list_of_the_environment_and_credentials_only_for_an_allowed_server(tmp_path):
    server_env = {"PATH": "/usr/bin", "LC_ALL": "C.UTF-8", "NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "x",
                  "HOME": "/home/operator", "SSH_AUTH_SOCK": "/run/user/1000/ssh", "WANDB_MODE": "offline",
                  "DATABASE_URL": "postgresql://operator:pw@db/jobs", "HF_HOME": str(tmp_path / "hf"), **SECRETS}
    allowed = "http://mlflow.internal:5000"
    service = make_service(tmp_path, env=server_env, tracking_uri_allow=[allowed], job_env=["WANDB_MODE"])
    base = service.env
    assert {"PATH", "LC_ALL", "NCCL_DEBUG", "PYTORCH_CUDA_ALLOC_CONF", "WANDB_MODE"} <= set(base)
    assert base["HF_HOME"] == str((tmp_path / "hf").resolve()) and base["TORCH_HOME"] == "/home/operator/.cache/torch"
    for name in (*SECRETS, "SSH_AUTH_SOCK", "DATABASE_URL", "HOME"):
        assert name not in base, name
    assert not any(v in str(base) for v in SECRETS.values())

    def job_with(uri):
        from trainforge.jobs.store import Job

        config = "name: j\n" + (f"log: {{mlflow: {{tracking_uri: '{uri}'}}}}\n" if uri else "")
        return Job(id=1, name="j", config_yaml=config)

    for uri, gets in [(allowed, True), (allowed + "/", True), (allowed + "/team", True),
                      ("http://attacker.example:5000", False), ("http://mlflow.internal:5001", False),
                      ("https://mlflow.internal:5000", False), ("http://mlflow.internal:5000@attacker.example", False),
                      ("http://mlflow.internal:50000", False), (None, False)]:
        env = service.job_env(job_with(uri))
        assert (env.get("MLFLOW_TRACKING_PASSWORD") == "op-password-123") is gets, uri
        assert "AWS_SECRET_ACCESS_KEY" not in env and "HF_TOKEN" not in env and "TRAINFORGE_TOKEN" not in env


def test_tracking_uri_allow_takes_plain_http_uris_and_matches_host_port_and_path():
    assert parse_tracking_allow(["https://mlflow.corp", "http://127.0.0.1:5000/team"])
    for bad in ("mlflow.corp", "file:///tmp/mlruns", "sqlite:///x.db", "https://user:pw@mlflow.corp",
                "https://mlflow.corp/?x=1", "http://:5000", "http://host:port"):
        with pytest.raises(UserError, match="--tracking-uri-allow"):
            parse_tracking_allow([bad])
    allowed = ["https://mlflow.corp", "http://127.0.0.1:5000/team"]
    assert uri_allowed("https://MLflow.Corp:443/", allowed) and uri_allowed("http://127.0.0.1:5000/team/x", allowed)
    for uri in ("http://mlflow.corp", "https://mlflow.corp.evil.example", "https://evil.example/https://mlflow.corp",
                "http://127.0.0.1:5000/teamx", "http://127.0.0.1:5000/", "https://mlflow.corp#x",
                "https://a@mlflow.corp", "https://mlflow.corp\\@evil.example", "http://127.0.0.1:notaport/team"):
        assert not uri_allowed(uri, allowed), uri


def test_remote_code_on_slurm_needs_a_fence_for_the_daemons_ports():
    """Issue 50, High 3: where the fence cannot deny TCP ports (unfenced jobs, Landlock before ABI 4), a Slurm server
    refuses --allow-remote-code at start with one line; a local server, or a server without it, starts."""
    from trainforge.jobs.sandbox import NET_ABI, remote_code_refusal

    assert remote_code_refusal("slurm", True, True, NET_ABI) == ""
    assert remote_code_refusal("slurm", False, False, 0) == ""
    assert remote_code_refusal("local", True, False, 0) == ""
    unfenced = remote_code_refusal("slurm", True, False, 7)
    old_kernel = remote_code_refusal("slurm", True, True, NET_ABI - 1)
    for line in (unfenced, old_kernel):
        assert line.startswith("--allow-remote-code: ") and "slurmctld" in line and "\n" not in line
    assert "--unsandboxed-jobs" in unfenced and f"ABI {NET_ABI - 1}" in old_kernel


def test_a_fence_with_denied_tcp_ports_refuses_them_and_no_other(tmp_path):
    """The port rule the Slurm backend adds: a connect to a denied port fails with EACCES, any other port connects."""
    import socket
    import subprocess
    import sys

    from trainforge.jobs import sandbox

    if sandbox.landlock_abi() < sandbox.NET_ABI:
        with pytest.raises(sandbox.SandboxError, match="TCP ports"):
            sandbox._Landlock(sandbox.Policy(read=("/",), denied_tcp_ports=(1,))).build()
        return
    with socket.create_server(("127.0.0.1", 0)) as denied, socket.create_server(("127.0.0.1", 0)) as open_:
        ports = denied.getsockname()[1], open_.getsockname()[1]
        policy = sandbox.Policy(read=("/",), write=(str(tmp_path),), devices=("/dev",), denied_tcp_ports=ports[:1])
        policy.save(tmp_path / "policy.json")
        assert sandbox.Policy.load(tmp_path / "policy.json") == policy
        code = ("import socket\nfor p in %r:\n    try:\n        socket.create_connection(('127.0.0.1', p), timeout=5)\n"
                "        print(p, 'open')\n    except OSError as e:\n        print(p, e.errno)\n" % (ports,))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             preexec_fn=sandbox.preexec(policy))
    assert out.stdout.split("\n")[:2] == [f"{ports[0]} 13", f"{ports[1]} open"], out.stdout + out.stderr
