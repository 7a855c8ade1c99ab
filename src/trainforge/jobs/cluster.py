"""The job queue on a cluster engine: the engine places and runs each job, the server keeps everything else.

    engine = make_engine("slurm", slurm=SlurmSettings(partition="debug"))     # `trainforge server --backend slurm`
    service = JobService(store, slots, state_dir, engine=engine)              # the service then calls, each poll:
    ClusterBackend(service, engine).tick()                                    # follow the engine's jobs, hand over new ones

What stays the server's, whatever the backend: admission (the recipe checked and sized by the planner before it is
queued), the queue order (priority, then submission), per-job restarts with `--resume auto`, cancel, the job's log,
its run directory (progress, curves, comparison) and the dashboard. What the engine does: where and when each job
runs. A job is handed over as soon as it is admitted, in queue order (the engine's own scheduler decides with the
resources the job asks for: processes, CPUs, and on CPU the memory its plan needs), and it is `queued` until the
engine runs it, with the engine's reason ("Resources", "Priority") beside it.

The engine's controller may be down: nothing is lost. A job not yet handed over stays queued and goes as soon as
the controller answers; the jobs the engine holds are followed again from where they were; a cancel is sent again.

A job a server restart finds in the table is followed by its engine id (`backend_id`); a job handed over just before
a crash, before its id was written, is found again by its name in the engine (`trainforge-<server>-<job>-<attempt>`),
so it is never submitted twice. A name is public (squeue shows it) and anyone may give one to a job, so a job is
followed only when it belongs to the server's own Unix user (the engine reports no other) and carries, as its
comment, an HMAC of its name under a key only the server holds (`<state>/engine.key`, 0600): a job another user or
another server named like ours is ignored, and ours is submitted.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Optional, Protocol

from trainforge.errors import UserError
from trainforge.files import read_regular, write_text_atomic
from trainforge.jobs import runner
from trainforge.jobs.environment import private_cache_env
from trainforge.jobs.slurm import EngineDown, EngineJob, EngineRefused, Slurm, SlurmSettings
from trainforge.jobs.store import FINAL_STATES, Job
from trainforge.launch.manifests import JobSpec, render
from trainforge.layout import JOB_CONFIG

log = logging.getLogger("trainforge.jobs")

BACKENDS = ("local", "slurm", "k8s", "skypilot")  # `trainforge server --backend` choices; local is the default
NOT_YET = ("k8s", "skypilot")  # named by the command's contract; no engine client is wired to the queue yet
# What a CPU training process needs besides the planner's peak (tensors, optimizer state, activations): the
# interpreter, torch and the data. Measured: `trainforge train digits_cnn train.max_steps=40 train.device=cpu` peaks
# at 0.89 GiB RSS (`/usr/bin/time -v`, torch 2.14, this planned peak included); 1 GiB on top of the plan is what the
# engine is asked for, so its scheduler never packs more processes on a node than fit.
PROCESS_BASE_BYTES = 2**30
# priority p -> sbatch --nice=clamp(NICE_DEFAULT - p, 0, NICE_MAX): under Slurm's multifactor priority a higher
# priority starts first (nice lowers a job's priority; only an operator may give a negative one). Small numbers: a
# nice larger than the site's priorities would floor them all and leave only submission order.
NICE_DEFAULT, NICE_MAX = 100, 10_000
JOB_SCRIPT = "job.sbatch"
ENGINE_KEY = "engine.key"  # in the server's state folder: the HMAC key of its engine jobs' comments


class Engine(Protocol):
    name: str

    def check(self) -> Optional[str]: ...

    def start_batch_job(self, script: Path, *, job_dir: Path, log: Path, name: str, mem_mb: Optional[int], nice: int,
               env: Mapping[str, str], comment: str = "") -> str: ...

    def poll(self) -> dict[str, EngineJob]: ...

    def daemon_ports(self) -> tuple[int, ...]: ...

    def cancel(self, job_id: str) -> None: ...


def check_backend(name: str) -> str:
    """`--backend NAME`: one of BACKENDS, and one that this version can run (one line otherwise)."""
    if name not in BACKENDS:
        raise UserError(f"--backend: expected {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}, got {name!r}")
    if name in NOT_YET:
        raise UserError(f"--backend {name}: the queue cannot dispatch to {name} yet; `trainforge launch {name} "
                        f"RECIPE` writes a job file you submit yourself, or use --backend slurm or local")
    return name


def make_engine(name: str, *, slurm: SlurmSettings = SlurmSettings(),
                env: Optional[Mapping[str, str]] = None) -> Optional[Engine]:
    """The engine for `--backend NAME` (None for local), checked: its commands exist, its settings are known to it.
    A controller that is down is a warning logged here, not an error: jobs wait for it."""
    if check_backend(name) == "local":
        return None
    engine = Slurm(slurm, env)
    warning = engine.check()
    if warning:
        log.warning("%s", warning)
    return engine


def nice_of(priority: int) -> int:
    """Slurm's --nice for a job of this priority (trainforge priorities -9,900 .. 100 span nice 10,000 .. 0)."""
    return min(max(NICE_DEFAULT - priority, 0), NICE_MAX)


def engine_key(state_dir: Path) -> bytes:
    """The server's secret for its engine jobs' comments: made once, private to the server's user, kept in its state
    folder (which job processes cannot read)."""
    path = Path(state_dir) / ENGINE_KEY
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        key = read_regular(path, 4096)[0].strip()
        if len(key) < 32:
            raise UserError(f"{path}: not a key this server wrote; remove it (jobs handed to the engine before a crash "
                            "are then submitted again)") from None
        return key
    key = secrets.token_hex(32).encode()
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
        f.flush()
        os.fsync(f.fileno())
    return key


def engine_comment(key: bytes, name: str) -> str:
    """The comment a job of this server carries in the engine: an HMAC of its name, which only the key's holder makes."""
    return "trainforge:" + hmac.new(key, name.encode(), hashlib.sha256).hexdigest()[:40]


def engine_name_of(state_dir: Path, job_id: int, attempt: int) -> str:
    """The job's name in the engine: this server (its state folder) and the job's attempt, found again after a crash."""
    server = hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]
    return f"trainforge-{server}-{job_id}-{attempt}"


class ClusterBackend:
    def __init__(self, service: Any, engine: Engine, poll_s: float) -> None:
        self.service = service  # the JobService (store, paths, prepare, job_env, settle, note)
        self.engine = engine
        self.poll_s = poll_s
        self._next_poll = 0.0
        self._down: Optional[str] = None  # the controller's last error while it is down
        self._cancel_sent: set[str] = set()
        self._key = engine_key(service.state_dir)
        self.daemon_ports: Optional[tuple[int, ...]] = None  # the engine's daemons' TCP ports, once it has answered
        self._fence_checks()

    @property
    def store(self):
        return self.service.store

    @property
    def name(self) -> str:
        return self.engine.name

    def origin(self, job: Job) -> str:
        """The engine's name; `local` for a job that ended on the machine before the server moved to the engine (it
        ran, and no engine ever had it)."""
        if job.backend_id is None and job.attempt > 0 and job.state in FINAL_STATES:
            return "local"
        return self.name

    def _fence_checks(self) -> None:
        """Ask the engine for its daemons' ports (until it has answered once) and keep the admission checks from
        them: a check may run a model's own code, with the server's credentials."""
        if self.daemon_ports is not None:
            return
        try:
            self.daemon_ports = tuple(self.engine.daemon_ports())
        except EngineDown:
            pass
        checker = self.service.checker
        if checker.fence is not None:
            checker.fence = replace(checker.fence, denied_tcp_ports=self.daemon_ports)

    # ------------------------------------------------------------ each poll

    def reconcile(self) -> None:
        """After a server start: a job a local server left `running` (no engine id) is stopped here and queued to
        resume on the engine; the jobs the engine holds are followed on the next tick."""
        for job in self.store.running():
            if job.backend_id is None:
                runner.kill_leftovers(self.service.paths(job.id).run)
                self.store.requeue(job.id, "was running on this machine; resumes on the cluster", count_restart=False)
                self.service.note(job.id, f"the server now runs jobs on {self.engine.name}: this job's local process "
                                          "was stopped; it resumes there with --resume auto")

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self.poll_s
        try:
            self._fence_checks()
            held = [j for j in self.store.list(["queued", "running"]) if j.backend_id]
            names: dict[str, str] = {}
            if held or self.store.queued():
                states = self.engine.poll()
                names = {ej.name: job_id for job_id, ej in states.items() if ej.name and ej.phase != "ended"
                         and hmac.compare_digest(ej.comment, engine_comment(self._key, ej.name))}
                for job in held:
                    self._follow(job, states.get(job.backend_id))
            self._hand_over(names)
        except EngineDown as e:
            if self._down is None:
                log.warning("%s controller does not answer (%s); queued jobs wait, nothing is lost", self.engine.name, e)
            self._down = str(e)
            why = f"waiting: {self.engine.name} does not answer ({e}); the job is submitted when it does"
            for job in self.store.queued():
                if not job.backend_id and job.reason != why:
                    self.store.note_reason(job.id, why)
            return
        if self._down is not None:
            log.info("%s controller answers again", self.engine.name)
            self._down = None

    def _follow(self, job: Job, ej: Optional[EngineJob]) -> None:
        if job.cancel_requested and ej is not None and ej.phase != "ended" and (
                job.backend_id not in self._cancel_sent or ej.phase == "pending"):
            self._send_cancel(job)  # not sent yet (the controller was down), or the job went back to pending
        if ej is None:  # the controller forgot it (MinJobAge passed while the server was away): judge what it left
            self._ended(job, None, "")
            return
        if ej.phase == "pending":
            why = f"waiting in {self.engine.name} ({ej.reason or ej.state}), job {job.backend_id}"
            if job.state == "running":  # the engine requeued it itself (node failure, preemption)
                self.store.engine_pending(job.id, why)
                self.service.note(job.id, f"{self.engine.name} requeued job {job.backend_id} ({ej.reason or ej.state}); "
                                          "it resumes from its newest checkpoint when it starts again")
            elif job.reason != why:
                self.store.note_reason(job.id, why)
        elif ej.phase == "running":
            if job.state == "queued":
                self.store.engine_started(job.id, list(ej.nodes))
                self.service.note(job.id, f"attempt {job.attempt} running on {', '.join(ej.nodes) or '?'} "
                                          f"({self.engine.name} job {job.backend_id})")
        else:
            self._ended(job, ej.exit_code, ej.state)

    def _ended(self, job: Job, engine_rc: Optional[int], state: str) -> None:
        self._cancel_sent.discard(job.backend_id or "")
        paths = self.service.paths(job.id)
        rc = runner.read_exit(paths, job.attempt)  # the wrapper's record of the trainer's own exit status
        if rc is None:
            rc = engine_rc
        outcome = None
        if state == "CANCELLED" and not job.cancel_requested and not runner.run_complete(paths.run):
            outcome = runner.Outcome("cancelled", f"cancelled in {self.engine.name} (job {job.backend_id}), not "
                                                  "through this server")
        elif state in ("TIMEOUT", "DEADLINE") and not runner.run_complete(paths.run):
            outcome = runner.Outcome("failed", f"{self.engine.name} ended job {job.backend_id}: {state.lower()} "
                                               "(the server's time limit); resubmit it to continue (--resume auto)")
        self.service.settle(job, rc, outcome)

    def _hand_over(self, live_names: Mapping[str, str]) -> None:
        """Queued jobs without an engine id go to the engine, in queue order."""
        for job in self.service.drop_unfit([j for j in self.store.queued() if not j.backend_id]):
            name = engine_name_of(self.service.state_dir, job.id, job.attempt + 1)
            found = live_names.get(name)
            if found is not None:  # handed over before a crash, its id never written: follow that one
                self.store.dispatch(job.id, found, f"submitted to {self.engine.name} as job {found}")
                continue
            try:
                backend_id = self._submit(job, name)
            except EngineRefused as e:
                self.store.finish(job.id, "failed", str(e))
                self.service.note(job.id, str(e))
                continue
            except (OSError, UserError) as e:
                self.store.finish(job.id, "failed", f"cannot submit the job: {e}")
                continue
            self.store.dispatch(job.id, backend_id, f"submitted to {self.engine.name} as job {backend_id}")
            self.service.note(job.id, f"attempt {job.attempt + 1}: submitted to {self.engine.name} as job {backend_id}")
            log.info("job %d attempt %d submitted to %s as job %s", job.id, job.attempt + 1, self.engine.name, backend_id)

    def _submit(self, job: Job, name: str) -> str:
        service = self.service
        paths = service.prepare(job)
        attempt = job.attempt + 1
        cpu = service.slots[0].kind == "cpu"
        nproc = job.num_gpus
        python = service.python
        wrapper = [python, "-m", "trainforge.jobs.wrapper", "--exit-file", str(paths.exit), "--attempt", str(attempt),
                   *(["--sandbox", str(paths.sandbox)] if service.sandboxed else []), "--", python, "-m", "trainforge"]
        settings = getattr(self.engine, "settings", SlurmSettings())
        spec = JobSpec(name=name, recipe_text=job.config_yaml, run_dir=str(paths.run),
                       gpus_per_node=0 if cpu else nproc, procs_per_node=nproc,
                       cpus_per_gpu=settings.cpus_per_process or (1 if cpu else 8),
                       partition=settings.partition, account=settings.account, qos=settings.qos,
                       time_limit=settings.time_limit, max_restarts=0,  # restarts are the server's
                       command=tuple(wrapper),  # one node: torchrun's standalone rendezvous, on a free port
                       # written by the unfenced batch script: in the job's folder, never in the run directory the
                       # trainer may write (a link it left there would be followed with the server's rights)
                       config_file=str(paths.path / JOB_CONFIG))
        if service.sandboxed:  # the fence also keeps the job's code from the engine's daemons (sbatch, scancel)
            self.daemon_ports = tuple(self.engine.daemon_ports())  # asked again: a node may have been added
            fence = replace(service.policy(paths), denied_tcp_ports=self.daemon_ports)
            fence.save(paths.sandbox)
        script = paths.path / JOB_SCRIPT
        write_text_atomic(script, render(self.engine.name, spec), mode=0o700)
        paths.exit.unlink(missing_ok=True)
        env = {**service.job_env(job), **private_cache_env(paths.tmp), "PYTHONUNBUFFERED": "1"}
        mem_mb = math.ceil(nproc * (job.memory_bytes + PROCESS_BASE_BYTES) / 2**20) if cpu else None
        return self.engine.start_batch_job(script, job_dir=paths.path, log=paths.log, name=name, mem_mb=mem_mb,
                                  nice=nice_of(job.priority), env=env, comment=engine_comment(self._key, name))

    # ------------------------------------------------------------ cancel

    def cancel(self, job: Job) -> Job:
        """A queued job the engine does not have yet: cancelled now. One the engine holds: marked, then cancelled in
        the engine (SIGTERM: it checkpoints); it turns `cancelled` when the engine says it ended. A controller that
        is down gets the cancel when it is back. A job that has ended: nothing to do."""
        if job.state not in ("queued", "running"):
            return job
        if not job.backend_id:
            self.store.finish(job.id, "cancelled", "cancelled by the user")
            return self.service.get(job.id)
        self.store.request_cancel(job.id)
        self._send_cancel(job)
        return self.service.get(job.id)

    def _send_cancel(self, job: Job) -> None:
        try:
            self.engine.cancel(job.backend_id)
        except EngineDown as e:
            self.service.note(job.id, f"cancel requested; {self.engine.name} does not answer ({e}): sent again when it does")
            return
        self._cancel_sent.add(job.backend_id)
        self.service.note(job.id, f"cancel requested: {self.engine.name} job {job.backend_id} cancelled (SIGTERM, then "
                                  "SIGKILL after the engine's grace)")
