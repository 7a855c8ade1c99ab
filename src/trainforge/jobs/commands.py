"""`trainforge server` and `trainforge jobs submit|list|show|logs|cancel`.

    trainforge server --gpus auto                          # scheduler + dashboard on http://127.0.0.1:8765
    trainforge server --gpus cpu:4 --slot-memory-gb 4      # four CPU slots (no GPU needed)
    trainforge server --host 0.0.0.0 --token-file ~/.trainforge-token --data-root /srv/data
                                                           # reachable from other machines: token required
    trainforge server --allow-hub-downloads                # submissions may name hub ids not yet in the cache
    trainforge server --tracking-uri-allow https://mlflow.corp   # jobs may log there (with this server's credentials)
    trainforge jobs submit digits_cnn train.max_steps=500 --gpus 1 --priority 5 --max-restarts 3
    trainforge jobs list --json
    trainforge jobs logs 3 --follow
    trainforge jobs cancel 3

The jobs commands find the server by --server, else $TRAINFORGE_SERVER, else http://127.0.0.1:8765.
Module-level imports stay light: the server, httpx and torch load inside the commands.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from trainforge.console import err, out, print_json
from trainforge.confine import parse_roots
from trainforge.errors import UserError, printable
from trainforge.jobs import sandbox as fence
from trainforge.jobs.environment import check_env_names, parse_tracking_allow
from trainforge.jobs.scheduler import check_placement
from trainforge.jobs.slots import parse_slots

LIST_FIELDS = ("id", "name", "state", "gpus", "restarts", "run_dir")  # `jobs list --json`: a fixed contract
FINAL = ("succeeded", "failed", "cancelled")

ServerOpt = typer.Option(None, "--server", help="Server URL (default: $TRAINFORGE_SERVER, else http://127.0.0.1:8765).")
TokenOpt = typer.Option(None, "--token", help="API token when the server has one; prefer $TRAINFORGE_TOKEN "
                                              "(an argument is visible in `ps`).")
JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON document.")


def _client(server: Optional[str], token: Optional[str]):
    from trainforge.jobs.client import Client, server_url  # httpx: the CLI starts fast without it

    return Client(server_url(server), token)


def _cell(value: object) -> str:
    """A value from the server as table text: no rich markup, and control characters (an ESC in a job name
    submitted before names were checked, in a reason quoting a job's output) shown as escapes, never sent to the
    terminal. rich's `escape` handles markup only; rich itself passes ESC and NUL through."""
    return escape(printable(str(value)))


def log_text(text: str) -> str:
    """A job's log as the terminal should show it: newlines and tabs kept, CRLF as a newline, every other
    control character (colours and cursor moves from the job's output or data) shown as its escape."""
    return printable(text.replace("\r\n", "\n"), keep="\n\t")


def _duration(s: Optional[float]) -> str:
    if s is None:
        return ""
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _progress(job: dict) -> str:
    p = job["progress"]
    return f"{p['step']}/{p['total_steps']}" if p.get("total_steps") else str(p["step"])


def server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but loopback needs a token."),
    port: int = typer.Option(8765, "--port", help="Port to bind."),
    db: Optional[str] = typer.Option(None, "--db", help="SQLAlchemy URL (default: SQLite in --state-dir); "
                                     "e.g. postgresql+psycopg://user@host/db"),
    gpus: str = typer.Option("auto", "--gpus", help="auto | GPU indices 0,1,... | cpu:N (N CPU slots) | gpu:N (with "
                             "--backend slurm: a node's N GPUs, --slot-memory-gb each)."),
    slot_memory_gb: Optional[float] = typer.Option(None, "--slot-memory-gb", "--memory-gb",
                                                   help="Memory each slot offers, GiB (cpu:N slots; default: "
                                                        "available memory / N; GPUs: 90% of theirs)."),
    state_dir: Path = typer.Option(Path("runs/server"), "--state-dir", help="Job run dirs, logs and the SQLite db."),
    data_root: Optional[List[str]] = typer.Option(None, "--data-root", help="A folder submitted recipes may read data "
                                                  "from (repeatable). Default: none, so data paths are refused."),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="Require the API token stored in this file "
                                              "(default: $TRAINFORGE_TOKEN)."),
    token: Optional[str] = typer.Option(None, "--token", hidden=True, help="Deprecated: visible in `ps`; use --token-file."),
    admission_timeout_s: float = typer.Option(120.0, "--admission-timeout-s", help="Most seconds a submission's check "
                                              "(reading its data, simulating its model) may take."),
    admission_memory_gb: float = typer.Option(4.0, "--admission-memory-gb", help="Most memory one submission's check "
                                              "may use, GiB."),
    placement: str = typer.Option("spread", "--placement", metavar="spread|pack", help="spread: each job to the least-loaded slots (most "
                                  "free memory) that hold it; pack: to the fullest slots that still hold it (best "
                                  "fit), keeping whole GPUs free for big jobs."),
    allow_hub_downloads: bool = typer.Option(False, "--allow-hub-downloads", help="Let submissions make this server "
                                             "download pretrained models (Hugging Face hub, torch hub; anonymously). "
                                             "Default: offline, and a hub id must already be in the local cache."),
    tracking_uri_allow: Optional[List[str]] = typer.Option(None, "--tracking-uri-allow", metavar="URI",
                                                           help="A tracking server (MLflow, http(s)) jobs may log to "
                                                           "(repeatable); the MLFLOW_TRACKING_* credentials in this "
                                                           "server's environment go to these only. Default: none."),
    job_env: Optional[List[str]] = typer.Option(None, "--job-env", metavar="NAME", help="Pass this variable of the "
                                                "server's environment on to jobs (repeatable); by default they get an "
                                                "allow-list (PATH, locale, CUDA/NCCL/torch/HF settings, caches)."),
    allow_remote_code: bool = typer.Option(False, "--allow-remote-code", help="Accept recipes that opt in to a "
                                           "model's own code (model.args.trust_remote_code: true): the .py files of "
                                           "a model folder then run in the job and in its admission check. Default: "
                                           "refused."),
    backend: str = typer.Option("local", "--backend", metavar="local|slurm|k8s|skypilot", help="Where jobs run: local "
                                "(this machine's --gpus) or slurm (submitted with sbatch; --gpus then describes what "
                                "one job may use on a node). k8s and skypilot: write job files with `trainforge "
                                "launch`."),
    slurm_partition: Optional[str] = typer.Option(None, "--slurm-partition", help="slurm: the partition jobs go to "
                                                  "(default: the cluster's default). Submitters cannot choose it."),
    slurm_account: Optional[str] = typer.Option(None, "--slurm-account", help="slurm: the account jobs are charged to."),
    slurm_qos: Optional[str] = typer.Option(None, "--slurm-qos", help="slurm: the quality of service of every job."),
    slurm_time_limit: Optional[str] = typer.Option(None, "--slurm-time-limit", help="slurm: --time of every job, "
                                                   "e.g. 24:00:00."),
    slurm_cpus_per_process: Optional[int] = typer.Option(None, "--slurm-cpus-per-process", help="slurm: CPUs per "
                                                         "training process (default: 1 on CPU, 8 per GPU)."),
    unsandboxed_jobs: bool = typer.Option(False, "--unsandboxed-jobs", help="Run jobs without their Landlock fence "
                                          "where the kernel has none (Linux < 6.2): a job could then write anything "
                                          "this user can. Only where every submitter is trusted."),
) -> None:
    """Run the job queue: scheduler, job processes, JSON API and web dashboard.

    Ctrl-C stops the server; running jobs keep going and a restarted server adopts them.
    """
    from trainforge.jobs.cluster import check_backend, make_engine
    from trainforge.jobs.server import is_loopback, serve  # heavy (fastapi); tests patch serve on the module
    from trainforge.jobs.slurm import SlurmSettings
    from trainforge.jobs.serverlog import log_to
    from trainforge.jobs.service import JobService, StateDirLock  # heavy (sqlalchemy): the CLI starts fast without it
    from trainforge.jobs.store import Store, sqlite_url  # heavy (sqlalchemy): the CLI starts fast without it

    os.umask(0o077)  # the database, logs, run dirs and checkpoints: readable by this user only
    secret = server_token(token_file, token)
    if not is_loopback(host) and not secret:
        raise UserError(f"--host: {host} makes the queue reachable from other machines; pass --token-file (or set "
                        "TRAINFORGE_TOKEN) so every API call must carry a token, or keep the default 127.0.0.1")
    if not 0 < port < 65536:
        raise UserError(f"--port: expected 1-65535, got {port}")
    if admission_timeout_s <= 0 or admission_memory_gb <= 0:
        raise UserError("--admission-timeout-s / --admission-memory-gb: expected positive numbers")
    check_placement(placement)
    check_backend(backend)
    if backend == "local" and gpus.strip().startswith("gpu:"):
        raise UserError("--gpus gpu:N: the GPUs of a cluster node, for --backend slurm; this machine's GPUs are named "
                        "by index (0,1,...) or auto")
    given = [f"--slurm-{n}" for n, v in (("partition", slurm_partition), ("account", slurm_account), ("qos", slurm_qos),
             ("time-limit", slurm_time_limit), ("cpus-per-process", slurm_cpus_per_process)) if v is not None]
    if given and backend != "slurm":
        raise UserError(f"{given[0]}: a setting of the Slurm backend; add --backend slurm or drop it")
    slurm = SlurmSettings(partition=slurm_partition, account=slurm_account, qos=slurm_qos, time_limit=slurm_time_limit,
                          cpus_per_process=slurm_cpus_per_process)
    roots = parse_roots(data_root or [])
    allowed = parse_tracking_allow(tracking_uri_allow or [])
    passed = check_env_names(job_env or [])
    abi = fence.landlock_abi()
    sandboxed = not unsandboxed_jobs or abi >= fence.MIN_ABI  # the flag only matters where there is no fence to put up
    if sandboxed and abi < fence.MIN_ABI:
        raise UserError(fence.unfenced_refusal(abi))
    refusal = fence.remote_code_refusal(backend, allow_remote_code, sandboxed, abi)
    if refusal:
        raise UserError(refusal)
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise UserError(f"--port: cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host") from None
    engine = make_engine(backend, slurm=slurm)  # its commands on PATH, the partition known (or the controller down)
    state_dir = state_dir.resolve()
    lock = StateDirLock(state_dir)
    lock.acquire()
    slots = parse_slots(gpus, slot_memory_gb)
    store = Store(db or sqlite_url(state_dir / "jobs.db"))
    described = ", ".join(f"{s.id} ({s.memory_bytes / 2**30:.1f} GiB)" for s in slots)
    err.print(f"trainforge server on http://{host}:{port}  state {state_dir}  slots: {escape(described)}  data roots: "
              f"{escape(', '.join(map(str, roots)) or 'none')}  token: {'required' if secret else 'none'}  "
              f"placement: {placement}  hub downloads: {'allowed' if allow_hub_downloads else 'off'}  tracking "
              f"servers: {escape(', '.join(allowed) or 'none')}  remote code: "
              f"{'allowed' if allow_remote_code else 'off'}  sandbox: {escape(fence.describe(abi))}  backend: "
              f"{escape(backend)}" + (f" (partition {escape(slurm_partition)})" if engine and slurm_partition else ""),
              highlight=False, soft_wrap=True)
    if not sandboxed:
        err.print(f"[bold red]warning:[/bold red] {fence.UNSANDBOXED_FLAG}: jobs run UNFENCED; any job can write, read and "
                  "overwrite whatever this user can, other jobs' results included", highlight=False, soft_wrap=True)
    elif abi < fence.SIGNAL_SCOPE_ABI:
        err.print(f"[yellow]warning:[/yellow] Landlock ABI {abi}: jobs cannot write outside their run directories, but "
                  f"can signal other processes of this user (ABI {fence.SIGNAL_SCOPE_ABI}, Linux 6.12, scopes them)",
                  highlight=False, soft_wrap=True)
    service = JobService(store, slots, state_dir, data_roots=roots, admission_timeout_s=admission_timeout_s,
                         admission_memory_bytes=int(admission_memory_gb * 2**30), placement=placement,
                         allow_hub_downloads=allow_hub_downloads, tracking_uri_allow=allowed, job_env=passed,
                         sandboxed=sandboxed, allow_remote_code=allow_remote_code, engine=engine)
    try:
        with log_to(sys.stderr):  # every line printable: job names, job output and refused data are escaped
            serve(service, host=host, port=port, token=secret)
    finally:
        store.close()
        lock.release()


def server_token(token_file: Optional[Path], token: Optional[str]) -> Optional[str]:
    """The API token: --token-file, else $TRAINFORGE_TOKEN, else --token (warned: argv is public in `ps`)."""
    if token_file is not None:
        try:
            mode = token_file.stat().st_mode
            text = token_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"--token-file: cannot read {token_file} ({getattr(e, 'strerror', None) or e}); "
                            "write the token into a file only you can read (chmod 600)") from None
        if not text or "\n" in text:
            raise UserError(f"--token-file: {token_file} must hold the token on one line")
        if mode & 0o077:
            err.print(f"[yellow]warning:[/yellow] {escape(str(token_file))} is readable by others; chmod 600 it",
                      highlight=False)
        return text
    if os.environ.get("TRAINFORGE_TOKEN"):
        return os.environ["TRAINFORGE_TOKEN"]
    if token:
        err.print("[yellow]warning:[/yellow] --token puts the token where `ps` shows it to every user of this "
                  "machine; use --token-file PATH or TRAINFORGE_TOKEN", highlight=False)
        return token
    return None


def submit(
    recipe: str = typer.Argument(..., help="Built-in recipe name or a local YAML file (sent to the server)."),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. train.max_steps=500"),
    gpus: int = typer.Option(1, "--gpus", help="GPUs (slots) the job needs; each must have room for it."),
    priority: int = typer.Option(0, "--priority", help="Higher starts first; equal priorities in submission order."),
    max_restarts: int = typer.Option(0, "--max-restarts", help="Restarts (with --resume auto) after the process dies."),
    server: Optional[str] = ServerOpt,
    token: Optional[str] = TokenOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Queue a training job: validated and sized by the server's planner; rejected if it can never fit."""
    job = _client(server, token).post_job(recipe, overrides or [], gpus=gpus, priority=priority, max_restarts=max_restarts)
    if as_json:
        print_json(job)
        return
    out.print(f"queued job {job['id']} ({_cell(job['name'])}): {job['memory_bytes'] / 2**20:.1f} MiB per {job.get('memory_per', 'GPU')}, "
              f"priority {job['priority']}", highlight=False, soft_wrap=True)


def list_jobs(server: Optional[str] = ServerOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """List the jobs: state, GPUs, progress, ETA, restarts."""
    jobs = _client(server, token).jobs()
    if as_json:
        print_json([{k: j[k] for k in LIST_FIELDS} for j in jobs])
        return
    table = Table(title="jobs")
    for col in ("id", "name", "state", "GPUs", "progress", "ETA", "restarts", "priority"):
        table.add_column(col, justify="right" if col in ("id", "restarts", "priority") else "left")
    for j in jobs:
        table.add_row(str(j["id"]), _cell(j["name"]), _cell(j["state"]), _cell(",".join(j["gpus"])), _progress(j),
                      _duration(j["progress"]["eta_s"]) if j["state"] == "running" else "",
                      f"{j['restarts']}/{j['max_restarts']}", str(j["priority"]))
    out.print(table)


def show(job_id: int = typer.Argument(..., help="Job id."), server: Optional[str] = ServerOpt,
         token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """One job in full: state, reason, slots, memory, progress, run dir, log file and config."""
    job = _client(server, token).job(job_id)
    if as_json:
        print_json(job)
        return
    table = Table(title=f"job {job['id']}", show_header=False)
    rows = [("name", job["name"]), ("state", job["state"]), ("reason", job["reason"] or ""),
            ("recipe", job["recipe"]), ("overrides", " ".join(job["overrides"])), ("GPUs", ",".join(job["gpus"])),
            (f"memory per {job.get('memory_per', 'GPU')}", f"{job['memory_bytes'] / 2**20:.1f} MiB"), ("progress", _progress(job)),
            ("restarts", f"{job['restarts']} of {job['max_restarts']}"), ("priority", str(job["priority"])),
            ("run dir", job["run_dir"]), ("log", job["log_path"])]
    for k, v in rows:
        table.add_row(k, _cell(v))
    out.print(table)


def logs(job_id: int = typer.Argument(..., help="Job id."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the job ends."),
         server: Optional[str] = ServerOpt, token: Optional[str] = TokenOpt) -> None:
    """Print a job's captured output (all attempts, with the server's notes between them)."""
    client = _client(server, token)
    offset = 0
    while True:
        chunk = client.logs(job_id, offset)
        sys.stdout.write(log_text(chunk["text"]))
        sys.stdout.flush()
        offset = chunk["offset"]
        if not follow or (chunk["state"] in FINAL and not chunk["text"]):
            return
        if not chunk["text"]:
            time.sleep(1.0)


def cancel(job_id: int = typer.Argument(..., help="Job id."), server: Optional[str] = ServerOpt,
           token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """Cancel a job: a queued one at once; a running one gets SIGTERM, saves a checkpoint and stops."""
    job = _client(server, token).cancel(job_id)
    if as_json:
        print_json(job)
        return
    if job["state"] == "running":
        out.print(f"job {job_id}: cancel requested; it stops after saving a checkpoint")
    else:
        out.print(f"job {job_id}: {job['state']}")


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the `trainforge` app."""
    app.command("server")(server)
    jobs_app = typer.Typer(no_args_is_help=True, help="Submit, list, inspect and cancel jobs on a trainforge server.")
    jobs_app.command("submit")(submit)
    jobs_app.command("list")(list_jobs)
    jobs_app.command("show")(show)
    jobs_app.command("logs")(logs)
    jobs_app.command("cancel")(cancel)
    app.add_typer(jobs_app, name="jobs")
