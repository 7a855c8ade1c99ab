"""`trainforge train ... --nproc-per-node N [--nnodes MIN:MAX --rdzv-endpoint HOST:PORT --max-restarts K]`.

The command becomes a torchrun (torch.distributed.run) launcher: it fixes the run directory, then starts
N workers per node, each running `python -m trainforge train ... --run-dir DIR --resume auto`. A worker
that dies makes torchrun restart the whole group (up to K times); `--resume auto` makes every restart
continue from the newest complete checkpoint. SIGTERM to the launcher reaches every worker: they agree
to stop, save one checkpoint together and exit 0.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from trainforge.errors import JobFailed, UserError


def check_options(nproc_per_node: int, nnodes: str, rdzv_endpoint: Optional[str], max_restarts: int) -> None:
    """One-line errors naming the flag, before anything is started."""
    if nproc_per_node < 1:
        raise UserError(f"--nproc-per-node: expected a positive number of processes, got {nproc_per_node}")
    if max_restarts < 0:
        raise UserError(f"--max-restarts: expected 0 or more, got {max_restarts}")
    lo, _, hi = nnodes.partition(":")
    if not lo.isdigit() or (hi and not hi.isdigit()) or int(lo) < 1 or (hi and int(hi) < int(lo)):
        raise UserError(f"--nnodes: expected N or MIN:MAX with 1 <= MIN <= MAX, got {nnodes!r}")
    multi_node = nnodes not in ("1", "1:1")
    if multi_node and not rdzv_endpoint:
        raise UserError("--rdzv-endpoint: required with more than one node (HOST:PORT of the rendezvous, e.g. node0:29500)")


def torchrun_args(
    worker_args: list[str],
    *,
    nproc_per_node: int,
    nnodes: str,
    rdzv_endpoint: Optional[str],
    max_restarts: int,
    run_id: str,
) -> list[str]:
    check_options(nproc_per_node, nnodes, rdzv_endpoint, max_restarts)
    args = [f"--nproc-per-node={nproc_per_node}", f"--nnodes={nnodes}", f"--max-restarts={max_restarts}"]
    if rdzv_endpoint:
        args += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={run_id}"]
    else:
        args += ["--standalone"]
    return [*args, "--module", "trainforge", "train", *worker_args]


def launch(
    recipe: Optional[str],
    overrides: list[str],
    *,
    run_dir: Optional[Path],
    resume: Optional[str],
    nproc_per_node: int,
    nnodes: str = "1",
    rdzv_endpoint: Optional[str] = None,
    max_restarts: int = 0,
) -> Path:
    """Run the workers to the end; returns the run directory. JobFailed when the group fails for good."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from trainforge.training.api import prepare_run

    check_options(nproc_per_node, nnodes, rdzv_endpoint, max_restarts)
    cfg, rd, _ = prepare_run(recipe, overrides, run_dir=run_dir, resume=resume)
    worker = [*([recipe] if recipe else []), *overrides, "--run-dir", str(rd), "--resume", "auto"]
    run_id = hashlib.sha256(str(rd.resolve()).encode()).hexdigest()[:16]
    args = torchrun_args(worker, nproc_per_node=nproc_per_node, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                         max_restarts=max_restarts, run_id=run_id)
    try:
        torchrun(args)
    except SignalException as e:  # preemption: the workers checkpointed together and exited
        if not (rd / "checkpoints" / "latest").exists():
            raise JobFailed(f"stopped by {e.sigval.name} before the first checkpoint") from None
    except ChildFailedError as e:
        raise JobFailed(f"the worker group failed after {max_restarts} restart(s): {_first_failure(e)}; "
                        f"resume with --run-dir {rd} --resume auto") from None
    return rd


def _first_failure(error) -> str:
    failures = getattr(error, "failures", {}) or {}
    for rank, failure in sorted(failures.items()):
        return f"rank {rank} exited with {failure.exitcode}"
    return str(error)
