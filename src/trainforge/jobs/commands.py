"""`trainforge server` and `trainforge jobs submit|list|show|logs|cancel`.

    trainforge server --gpus auto                          # scheduler + dashboard on http://127.0.0.1:8765
    trainforge server --gpus cpu:4 --slot-memory-gb 4      # four CPU slots (no GPU needed)
    trainforge server --host 0.0.0.0 --token $SECRET       # reachable from other machines: token required
    trainforge jobs submit digits_cnn train.max_steps=500 --gpus 1 --priority 5 --max-restarts 3
    trainforge jobs list --json
    trainforge jobs logs 3 --follow
    trainforge jobs cancel 3

The jobs commands find the server by --server, else $TRAINFORGE_SERVER, else http://127.0.0.1:8765.
Module-level imports stay light: the server, httpx and torch load inside the commands.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from trainforge.console import err, out, print_json
from trainforge.errors import UserError

LIST_FIELDS = ("id", "name", "state", "gpus", "restarts", "run_dir")  # `jobs list --json`: a fixed contract
FINAL = ("succeeded", "failed", "cancelled")

ServerOpt = typer.Option(None, "--server", help="Server URL (default: $TRAINFORGE_SERVER, else http://127.0.0.1:8765).")
TokenOpt = typer.Option(None, "--token", help="API token when the server has one (default: $TRAINFORGE_TOKEN).")
JsonOpt = typer.Option(False, "--json", help="Print exactly one JSON document.")


def _client(server: Optional[str], token: Optional[str]):
    from trainforge.jobs.client import Client, server_url

    return Client(server_url(server), token)


def _duration(s: Optional[float]) -> str:
    if s is None:
        return ""
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _progress(job: dict) -> str:
    p = job["progress"]
    return f"{p['step']}/{p['total_steps']}" if p.get("total_steps") else str(p["step"])


def server(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind; anything but loopback needs --token."),
    port: int = typer.Option(8765, "--port", help="Port to bind."),
    db: Optional[str] = typer.Option(None, "--db", help="SQLAlchemy URL (default: SQLite in --state-dir); "
                                     "e.g. postgresql+psycopg://user@host/db"),
    gpus: str = typer.Option("auto", "--gpus", help="auto | GPU indices 0,1,... | cpu:N (N CPU slots)."),
    slot_memory_gb: Optional[float] = typer.Option(None, "--slot-memory-gb", "--memory-gb",
                                                   help="Memory each slot offers, GiB (cpu:N slots; default: "
                                                        "available memory / N; GPUs: 90% of theirs)."),
    state_dir: Path = typer.Option(Path("runs/server"), "--state-dir", help="Job run dirs, logs and the SQLite db."),
    token: Optional[str] = typer.Option(None, "--token", help="Require this API token (default: $TRAINFORGE_TOKEN)."),
) -> None:
    """Run the job queue: scheduler, job processes, JSON API and web dashboard.

    Ctrl-C stops the server; running jobs keep going and a restarted server adopts them.
    """
    import logging
    import socket

    from trainforge.jobs.server import is_loopback, serve
    from trainforge.jobs.service import JobService, StateDirLock
    from trainforge.jobs.slots import parse_slots
    from trainforge.jobs.store import Store, sqlite_url

    token = token or os.environ.get("TRAINFORGE_TOKEN") or None
    if not is_loopback(host) and not token:
        raise UserError(f"--host: {host} makes the queue reachable from other machines; pass --token (or set "
                        "TRAINFORGE_TOKEN) so every API call must carry it, or keep the default 127.0.0.1")
    if not 0 < port < 65536:
        raise UserError(f"--port: expected 1-65535, got {port}")
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise UserError(f"--port: cannot listen on {host}:{port} ({e.strerror}); pick another --port or --host") from None
    state_dir = state_dir.resolve()
    lock = StateDirLock(state_dir)
    lock.acquire()
    slots = parse_slots(gpus, slot_memory_gb)
    store = Store(db or sqlite_url(state_dir / "jobs.db"))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    described = ", ".join(f"{s.id} ({s.memory_bytes / 2**30:.1f} GiB)" for s in slots)
    err.print(f"trainforge server on http://{host}:{port}  state {state_dir}  slots: {escape(described)}", highlight=False,
              soft_wrap=True)
    try:
        serve(JobService(store, slots, state_dir), host=host, port=port, token=token)
    finally:
        store.close()
        lock.release()


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
    job = _client(server, token).submit(recipe, overrides or [], gpus=gpus, priority=priority, max_restarts=max_restarts)
    if as_json:
        print_json(job)
        return
    out.print(f"queued job {job['id']} ({escape(job['name'])}): {job['memory_bytes'] / 2**20:.1f} MiB per GPU, "
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
        table.add_row(str(j["id"]), escape(j["name"]), j["state"], ",".join(j["gpus"]), _progress(j),
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
            ("memory per GPU", f"{job['memory_bytes'] / 2**20:.1f} MiB"), ("progress", _progress(job)),
            ("restarts", f"{job['restarts']} of {job['max_restarts']}"), ("priority", str(job["priority"])),
            ("run dir", job["run_dir"]), ("log", job["log_path"])]
    for k, v in rows:
        table.add_row(k, escape(str(v)))
    out.print(table)


def logs(job_id: int = typer.Argument(..., help="Job id."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new output until the job ends."),
         server: Optional[str] = ServerOpt, token: Optional[str] = TokenOpt) -> None:
    """Print a job's captured output (all attempts, with the server's notes between them)."""
    client = _client(server, token)
    offset = 0
    while True:
        chunk = client.logs(job_id, offset)
        sys.stdout.write(chunk["text"])
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
