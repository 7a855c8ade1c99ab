"""`trainforge train ... --nproc-per-node N [--nnodes MIN:MAX --rdzv-endpoint HOST:PORT --max-restarts K]`.

The command becomes a torchrun (torch.distributed.run) launcher: it fixes the run directory, checks the
config, the data, the model and the batch geometry for every world size the run may have, then starts
N workers per node, each running `python -m trainforge train ... --run-dir DIR --resume auto`. A worker
that dies makes torchrun restart the whole group (up to K times); `--resume auto` makes every restart
continue from the newest complete checkpoint. A worker that exits 2 (bad input found only once it ran)
is never restarted: it writes its one-line error to DIR/.user_error and the launcher exits 2 with it.
SIGTERM to the launcher reaches every worker: they agree to stop, save one checkpoint together and exit 0.

Elastic (`--nnodes MIN:MAX`): every node runs the same command with `--resume auto`, a node joining later
too; the workers stop with a checkpoint, re-rendezvous with the new node count and resume.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

from trainforge.errors import JobFailed, UserError
from trainforge.engine.microbatch import batch_geometry, per_rank_batch
from trainforge.layout import CHECKPOINTS, LATEST, USER_ERROR

if TYPE_CHECKING:
    from trainforge.config import Config

USER_ERROR_FILE = USER_ERROR  # in the run directory: a worker's one-line error, for every node's launcher
USER_ERROR_ENV = "TRAINFORGE_USER_ERROR_FILE"  # where a launched worker writes it
USER_ERROR_EXIT = 2


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


def node_counts(nnodes: str) -> range:
    """Every number of nodes `--nnodes N` or `--nnodes MIN:MAX` admits."""
    lo, _, hi = nnodes.partition(":")
    return range(int(lo), int(hi or lo) + 1)


def check_run(cfg: Config, *, nproc_per_node: int, nnodes: str) -> None:
    """Refuse, before any worker starts, what every worker would refuse at its start: the batch geometry and
    the strategy at each world size the node range allows, the data, the model and its arguments.

    The rest is the run's own pre-flight (engine.preflight), the model on the meta device (no memory, no weights;
    a custom model, the user's own code, that cannot run there is built on the CPU)."""
    # heavy (torch): cli.py imports this module at start
    from trainforge.engine.env import DistEnv, resolve_strategy
    from trainforge.engine.preflight import preflight

    tc = cfg.train
    counts = node_counts(nnodes)
    for nodes in counts:
        world_size = nodes * nproc_per_node
        try:
            if isinstance(tc.micro_batch_size, int):
                batch_geometry(tc.global_batch_size, tc.micro_batch_size, world_size)
            else:  # auto: the workers pick the micro-batch; only the split over the ranks is known here
                per_rank_batch(tc.global_batch_size, world_size)
            resolve_strategy(cfg.distributed.strategy, DistEnv(world_size=world_size))
        except UserError as e:
            if len(counts) == 1:
                raise
            raise UserError(f"{e} (at {nodes} node{'s' if nodes > 1 else ''} x {nproc_per_node} processes, "
                            f"which --nnodes {nnodes} allows)") from None
    preflight(cfg, fit_stats=False, on_meta=True)  # the workers fit the statistics


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
        node_id = os.environ.get("SLURM_NODEID")
        if node_id is not None and node_id.isdigit():
            # under srun the first node of the allocation hosts the rendezvous store (the job file's endpoint is its
            # address), said outright: torchrun's guess by hostname fails where a node's name is not its address,
            # and where two nodes share one (all of them would try to host it)
            args.append(f"--rdzv-conf=is_host={'true' if node_id == '0' else 'false'}")
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
    """Run the workers to the end; returns the run directory. UserError (exit 2) for bad input, found here or
    by a worker; JobFailed when the group fails for good."""
    # heavy (torch): cli.py imports this module at start
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    from trainforge.training.api import prepare_run

    check_options(nproc_per_node, nnodes, rdzv_endpoint, max_restarts)
    multi_node = rdzv_endpoint is not None
    # A node that joins a running job finds the run (maybe before its first checkpoint): it must neither
    # refuse it nor move its files aside as an unusable attempt.
    cfg, rd, _ = prepare_run(recipe, overrides, run_dir=run_dir, resume=resume, start_over=not multi_node)
    check_run(cfg, nproc_per_node=nproc_per_node, nnodes=nnodes)
    worker = [*([recipe] if recipe else []), *overrides, "--run-dir", str(rd), "--resume", "auto"]
    run_id = hashlib.sha256(str(rd.resolve()).encode()).hexdigest()[:16]
    args = torchrun_args(worker, nproc_per_node=nproc_per_node, nnodes=nnodes, rdzv_endpoint=rdzv_endpoint,
                         max_restarts=max_restarts, run_id=run_id)
    error_file = rd.resolve() / USER_ERROR_FILE
    error_file.unlink(missing_ok=True)  # an earlier launch's
    env = {USER_ERROR_ENV: str(error_file)}
    if multi_node:
        # The c10d rendezvous shares the agent's TCPStore with the workers by default. Then a node joining a
        # running job hangs: the store host, still rank 0, skips publishing MASTER_ADDR/PORT for the new round
        # while the newcomer waits for them, and both agents fail with a DistStoreError after 60 s; the
        # workers' per-attempt key prefix (TORCHELASTIC_RESTART_COUNT) is not the same on all nodes either
        # (pytorch/pytorch#135712). Unshared, rank 0's agent publishes a fresh address in every round and
        # the workers start a fresh store on it.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    try:
        with _environment(env), _user_errors_are_final(error_file):
            torchrun(args)
    except SignalException as e:  # preemption: the workers checkpointed together and exited
        if not (rd / CHECKPOINTS / LATEST).exists():
            raise JobFailed(f"stopped by {e.sigval.name} before the first checkpoint") from None
    except Exception as e:  # noqa: BLE001 - a worker's bad input wins over how torchrun reported the failure
        line = user_error_line(error_file, getattr(e, "failures", None))
        if line is not None:
            raise UserError(line) from None
        if isinstance(e, ChildFailedError):
            raise JobFailed(f"the worker group failed after {max_restarts} restart(s): {_first_failure(e)}; "
                            f"resume with --run-dir {rd} --resume auto") from None
        raise
    return rd


def report_user_error(error: UserError) -> bool:
    """In a worker started by `launch`: write the error's line where the launcher reads it (the first rank to
    fail writes it). True when the launcher will report it, so the worker need not."""
    path = os.environ.get(USER_ERROR_ENV)
    if not path:
        return False
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return True
    except OSError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(str(error).replace("\n", " ") + "\n")
    return True


def user_error_line(error_file: Path, failures: Optional[dict] = None) -> Optional[str]:
    """The line a worker reported, or a generic line when a worker exited 2 without one; None otherwise."""
    try:
        line = error_file.read_text().strip()
    except OSError:
        line = ""
    if line:
        return line
    if error_file.exists() or any(getattr(f, "exitcode", None) == USER_ERROR_EXIT for f in (failures or {}).values()):
        return "a worker exited with 2 (bad input); its message is in the workers' output above"
    return None


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """These variables for the agent and, inherited, its workers; the caller's environment restored after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _user_errors_are_final(error_file: Path) -> Iterator[None]:
    """torchrun restarts a failed worker group whatever the cause and has no notion of an error that a
    restart cannot fix (pytorch/pytorch#133877). Its agent is given one more rule: a group in which a
    worker exited 2, or after which some worker (of any node) reported bad input, has no restarts left.

    torch.distributed.run builds its agent as `launcher.api.LocalElasticAgent`: that name is pointed at
    a subclass for the duration of the launch. Should torch rename what is overridden, the rule is lost
    and the launcher still exits 2, after the restarts."""
    # heavy (torch): cli.py imports this module at start
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.agent.server.api import WorkerState

    base = launcher_api.LocalElasticAgent

    class Agent(base):  # type: ignore[misc, valid-type]
        def _monitor_workers(self, worker_group):  # noqa: ANN001, ANN202 - torch's signature
            result = super()._monitor_workers(worker_group)
            if result.state == WorkerState.FAILED and user_error_line(error_file, result.failures) is not None:
                self._remaining_restarts = 0
            return result

    launcher_api.LocalElasticAgent = Agent
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = base


def _first_failure(error) -> str:
    failures = getattr(error, "failures", {}) or {}
    for rank, failure in sorted(failures.items()):
        return f"rank {rank} exited with {failure.exitcode}"
    return str(error)
