"""The queue itself: admission, scheduling, job processes, restarts, cancel, and reconcile after a restart.

    service = JobService(Store(url), parse_slots("cpu:4", 4), state_dir="runs/server")
    service.start()                        # reconcile with reality, then a background loop every poll_s
    job = service.enqueue(Submission(recipe="digits_cnn", overrides=("train.max_steps=50",)))
    service.cancel(job.id)
    service.stop()                         # the loop stops; running jobs keep running (a restart adopts them)

One loop thread does every state change of running jobs (watch, then schedule) under one lock, so a job
is started at most once. Submissions are validated on a pool of admission threads (`admission.load_submission`:
no file is read) and sized in a capped child process (`sizing.SizeChecker`: the data and the planner), so
the HTTP API stays responsive and one slow submission never holds up another; checked submissions, admitted
or refused, are remembered in bounded LRU caches keyed by their content. Each submitter (`Submission.submitter`)
may hold all check slots but one.

Everything the server writes is private to its user: directories 0700, files 0600 (job processes run with
umask 077), and job processes get neither the API token nor anything else the server was told in secret
(nor its Hugging Face token); they run offline (HF_HUB_OFFLINE=1) unless the operator allowed hub downloads.

Reconcile (on start): a job the table calls running whose process is still alive and ours is adopted and
watched; one whose process is gone is judged from what it left (the wrapper's exit.json, the run
directory's final model), then marked succeeded or requeued with --resume auto, like any ended attempt.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

import yaml

from trainforge.errors import UserError
from trainforge.files import SHARED_HOME_ENV, lock_file, write_text_atomic
from trainforge.layout import CONFIG_TEXT, JobDir
from trainforge.jobs import runner
from trainforge.confine import ENV as ROOTS_ENV
from trainforge.confine import roots_env
from trainforge.jobs import sandbox
from trainforge.jobs.environment import inherited_env, model_caches, tracking_secrets, uri_allowed
from trainforge.jobs.pretrained import hub_env
from trainforge.jobs.progress import progress
from trainforge.jobs.scheduler import PLACEMENTS, check_placement, never_fits
from trainforge.jobs.sizing import DEFAULT_MEMORY_BYTES, DEFAULT_PARALLEL, DEFAULT_TIMEOUT_S, Busy, SizeChecker
from trainforge.jobs.slots import Slot, gpu_stats
from trainforge.jobs.store import FINAL_STATES, Job, Store
from trainforge.jobs.cluster import ClusterBackend
from trainforge.jobs.local import Backend, LocalBackend

if TYPE_CHECKING:
    from trainforge.jobs.admission import Admitted
    from trainforge.jobs.cluster import Engine

log = logging.getLogger("trainforge.jobs")

ENGINE_POLL_S = 2.0  # how often a cluster engine is asked about its jobs (one `scontrol show job` a poll)
CANCEL_GRACE_S = 60.0  # SIGTERM, then SIGKILL if the trainer has not checkpointed and exited by then
ADMITTED_CACHE_SIZE = 256  # checked submissions remembered (an identical resubmission is not checked again)
REFUSED_CACHE_SIZE = 256  # submissions their check refused, remembered by the same key with the line they got
REFUSED_TTL_S = 600.0  # ... for 10 minutes: a refusal that depended on the data or the load is checked again later
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


class JobNotFound(LookupError):
    pass


@dataclass(frozen=True)
class Submission:
    recipe: str
    recipe_yaml: Optional[str] = None
    overrides: tuple[str, ...] = ()
    num_gpus: int = 1
    priority: int = 0
    max_restarts: int = 0
    submitter: str = "local"  # who sent it (`peers.submitter`): each has a share of the check slots; not in the key


class JobService:
    def __init__(self, store: Store, slots: Sequence[Slot], state_dir: Path, *, poll_s: float = 0.5,
                 cancel_grace_s: float = CANCEL_GRACE_S, python: str = sys.executable,
                 env: Optional[dict[str, str]] = None, data_roots: Sequence[Path] = (),
                 admission_timeout_s: float = DEFAULT_TIMEOUT_S, admission_memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 admission_parallel: int = DEFAULT_PARALLEL, placement: str = PLACEMENTS[0],
                 allow_hub_downloads: bool = False, tracking_uri_allow: Sequence[str] = (),
                 job_env: Sequence[str] = (), sandboxed: bool = True, allow_remote_code: bool = False,
                 engine: Optional["Engine"] = None, engine_poll_s: float = ENGINE_POLL_S) -> None:
        if not slots:
            raise UserError("--gpus: no slots to run jobs on; pass GPU indices or cpu:N")
        abi = sandbox.landlock_abi()
        if sandboxed and abi < sandbox.MIN_ABI:
            raise UserError(sandbox.unfenced_refusal(abi))
        self.sandboxed = sandboxed
        self.placement = check_placement(placement)  # spread: least-loaded slots; pack: best fit (jobs/scheduler.py)
        self.store = store
        self.slots = list(slots)
        self.slot_by_id = {s.id: s for s in self.slots}
        # what memory_bytes is counted per: a GPU where every slot is one, else a slot (`--gpus cpu:N`)
        self.memory_per = "GPU" if all(s.kind == "gpu" for s in self.slots) else "slot"
        self.state_dir = Path(state_dir).resolve()
        private_dir(self.state_dir)
        self.poll_s = poll_s
        self.cancel_grace_s = cancel_grace_s
        self.python = python
        self.data_roots = tuple(data_roots)
        self.allow_hub_downloads = allow_hub_downloads  # else a hub id must be cached, and nothing downloads
        self.allow_remote_code = allow_remote_code  # else a recipe's trust_remote_code: true is refused
        self.tracking_uri_allow = tuple(tracking_uri_allow)  # the only tracking servers a job may log to
        server_env = os.environ if env is None else env
        self.caches = model_caches(server_env)
        # an allow-list, never the whole environment: the operator's secrets stay with the operator
        self.prepared = self.state_dir / "cache"  # manifests and token shards the checks prepare; jobs only read it
        private_dir(self.prepared)
        self.env = {**inherited_env(server_env, job_env), **self.caches, ROOTS_ENV: roots_env(self.data_roots),
                    SHARED_HOME_ENV: str(self.prepared), **hub_env(allow_hub_downloads)}
        self.tracking_secrets = tracking_secrets(server_env)  # only for a job whose tracking server is allowed
        self.checker = SizeChecker(data_roots=self.data_roots, timeout_s=admission_timeout_s,
                                   memory_bytes=admission_memory_bytes, max_parallel=admission_parallel,
                                   allow_hub_downloads=allow_hub_downloads, caches=list(self.caches.values()),
                                   sandboxed=sandboxed, prepared=self.prepared)
        self._lock = threading.RLock()
        self._admitted: OrderedDict[str, Admitted] = OrderedDict()
        self._refused: OrderedDict[str, tuple[float, str]] = OrderedDict()  # key -> (when, the public line)
        self._admitted_lock = threading.Lock()
        self._final_progress: dict[int, dict[str, Any]] = {}
        # more threads than checks: a submission that is refused before its check, or answered from the
        # cache, or told "busy", never waits behind the checks in flight
        self._admit_pool = ThreadPoolExecutor(2 * admission_parallel + 2, thread_name_prefix="trainforge-admit")
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # who places and runs the jobs: this machine's slots (jobs/local.py), or a cluster engine (jobs/cluster.py)
        self.backend: Backend = LocalBackend(self) if engine is None else ClusterBackend(self, engine, engine_poll_s)

    # ------------------------------------------------------------ paths and views

    @property
    def backend_name(self) -> str:
        return self.backend.name

    def backend_of(self, job: Job) -> str:
        """Where the job runs or ran (a job that ended on this machine before the server moved to a cluster engine
        stays `local`)."""
        return self.backend.origin(job)

    def paths(self, job_id: int) -> JobDir:
        return JobDir(self.state_dir / "jobs" / str(job_id))

    def get(self, job_id: int) -> Job:
        job = self.store.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job

    def _progress(self, job: Job) -> dict[str, Any]:
        """Step, total and ETA from metrics.jsonl; remembered once the job has ended (its file no longer changes)."""
        if job.state not in FINAL_STATES:
            return progress(Path(job.run_dir), job.total_steps)
        if job.id not in self._final_progress:
            self._final_progress[job.id] = progress(Path(job.run_dir), job.total_steps)
        return self._final_progress[job.id]

    def view(self, job: Job, *, detail: bool = False) -> dict[str, Any]:
        """A job as the API shows it; `gpus` are the slot ids of its current (or last) attempt."""
        doc = {
            "id": job.id, "name": job.name, "state": job.state, "gpus": list(job.slots), "restarts": job.restarts,
            "run_dir": job.run_dir, "num_gpus": job.num_gpus, "priority": job.priority,
            "max_restarts": job.max_restarts, "attempt": job.attempt, "recipe": job.recipe,
            "overrides": list(job.overrides), "memory_bytes": job.memory_bytes, "reason": job.reason,
            "cancel_requested": job.cancel_requested, "submitted_at": job.submitted_at,
            "started_at": job.started_at, "finished_at": job.finished_at, "pid": job.pid,
            "progress": self._progress(job), "backend": self.backend_of(job), "backend_id": job.backend_id,
            "memory_per": self.memory_per,
        }
        if detail:
            doc[CONFIG_TEXT] = job.config_yaml
            doc["log_path"] = job.log_path
        return doc

    # ------------------------------------------------------------ enqueue and cancel (any thread)

    def enqueue(self, sub: Submission) -> Job:
        """Validate, size and queue a job (blocking: runs the planner); UserError when it is bad or can never fit."""
        if sub.num_gpus < 1:
            raise UserError(f"--gpus: expected 1 or more GPUs per job, got {sub.num_gpus}")
        if sub.max_restarts < 0:
            raise UserError(f"--max-restarts: expected 0 or more, got {sub.max_restarts}")
        admitted = self._admit(sub)
        job = self.store.create(
            job_dir_for=lambda i: str(self.paths(i).path), name=admitted.name, recipe=sub.recipe,
            overrides=list(sub.overrides), config_yaml=admitted.config_yaml, num_gpus=sub.num_gpus,
            priority=sub.priority, max_restarts=sub.max_restarts, memory_bytes=admitted.memory_bytes,
            total_steps=admitted.total_steps,
        )
        log.info("job %d queued: %s (%.1f MiB per device, priority %d)", job.id, job.name,
                 job.memory_bytes / 2**20, job.priority)
        return job

    def _warm_up(self) -> None:
        """Import admission (torch, the registries) and start the fork server, after the server is up: a
        restarted server must adopt its running jobs at once, not after seconds of imports."""
        from trainforge.jobs import admission  # heavy (torch): the server starts without it

        del admission
        self.checker.warm()

    def _admit(self, sub: Submission) -> "Admitted":
        """The checked submission, from the caches when this content was checked before: admitted (LRU of
        ADMITTED_CACHE_SIZE) or refused by its check (LRU of REFUSED_CACHE_SIZE, each remembered REFUSED_TTL_S, so
        a resubmitted oversized job costs nothing; later, or after the data changed, it is checked again)."""
        key = hashlib.sha256(json.dumps([sub.recipe, sub.recipe_yaml, list(sub.overrides), sub.num_gpus]).encode()).hexdigest()
        with self._admitted_lock:
            if key in self._admitted:
                self._admitted.move_to_end(key)
                return self._admitted[key]
            refused = self._refused.pop(key, None)
            if refused is not None and time.monotonic() - refused[0] < REFUSED_TTL_S:
                self._refused[key] = refused  # the most recent again
                raise UserError(refused[1], public=True)
        from trainforge.jobs.admission import load_submission  # heavy (torch): imported by start()'s warm-up

        cfg = load_submission(sub.recipe, sub.recipe_yaml, sub.overrides, data_roots=self.data_roots,
                              allow_hub_downloads=self.allow_hub_downloads, tracking_uri_allow=self.tracking_uri_allow,
                              allow_remote_code=self.allow_remote_code)
        try:
            admitted = self.checker.size(cfg.to_yaml(), sub.num_gpus, self.slots, submitter=sub.submitter)
        except Busy:
            raise  # not an answer about this submission
        except UserError as e:  # the check's public line, the only thing the API shows
            with self._admitted_lock:
                self._refused[key] = (time.monotonic(), e.public if isinstance(e.public, str) else str(e))
                while len(self._refused) > REFUSED_CACHE_SIZE:
                    self._refused.popitem(last=False)
            raise
        with self._admitted_lock:
            self._admitted[key] = admitted
            while len(self._admitted) > ADMITTED_CACHE_SIZE:
                self._admitted.popitem(last=False)
        return admitted

    async def enqueue_async(self, sub: Submission) -> Job:
        """`enqueue` on an admission thread, so the event loop keeps answering while the planner runs."""
        return await asyncio.get_running_loop().run_in_executor(self._admit_pool, partial(self.enqueue, sub))

    def cancel(self, job_id: int) -> Job:
        """Queued: cancelled now. Running: the backend stops it (the trainer checkpoints and exits; SIGKILL after
        a grace); the job turns cancelled when it has ended."""
        with self._lock:
            return self.backend.cancel(self.get(job_id))

    # ------------------------------------------------------------ the loop

    def start(self) -> None:
        self.reconcile()
        self._admit_pool.submit(self._warm_up)  # the first submission need not wait for torch and the planner
        self._thread = threading.Thread(target=self._loop, name="trainforge-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._admit_pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one bad tick (a database hiccup) must not stop the queue
                log.exception("scheduler tick failed; retrying")
            self._stop.wait(self.poll_s)

    def tick(self) -> None:
        """Watch running jobs (ended? cancel overdue?), then start (or hand over) what fits."""
        with self._lock:
            self.backend.tick()

    def reconcile(self) -> None:
        """Make the table agree with the processes (or the engine's jobs) that exist, before anything new starts."""
        with self._lock:
            self.backend.reconcile()

    def settle(self, job: Job, rc: Optional[int], outcome: Optional[runner.Outcome] = None) -> None:
        """Record how an ended attempt came out (`rc`: the trainer's exit status, None when unknown): succeeded,
        cancelled, failed, or queued again to resume."""
        paths = self.paths(job.id)
        if outcome is None:
            outcome = runner.judge(rc, complete=runner.run_complete(paths.run), cancel_requested=job.cancel_requested,
                                   restarts=job.restarts, max_restarts=job.max_restarts,
                                   last_line=runner.last_log_line(paths.log))
        if outcome.state == "queued":
            self.store.requeue(job.id, outcome.reason)
            self.note(job.id, f"attempt {job.attempt} ended: {outcome.reason}; restart {job.restarts + 1} of "
                               f"{job.max_restarts} with --resume auto")
            log.warning("job %d: %s; requeued (restart %d of %d)", job.id, outcome.reason, job.restarts + 1, job.max_restarts)
        else:
            self.store.finish(job.id, outcome.state, outcome.reason)
            shutil.rmtree(paths.tmp, ignore_errors=True)  # its temp files and caches: the run directory stays
            self.note(job.id, f"attempt {job.attempt} ended: {outcome.state}" + (f" ({outcome.reason})" if outcome.reason else ""))
            log.info("job %d %s%s", job.id, outcome.state, f": {outcome.reason}" if outcome.reason else "")

    def drop_unfit(self, queued: list[Job]) -> list[Job]:
        """`queued` without the jobs that can never run on these slots (queued under a server with larger ones:
        they would block the queue forever), which fail with the reason."""
        capacity = {s.id: s.memory_bytes for s in self.slots}
        fit = []
        for job in queued:
            reason = never_fits(capacity, job.memory_bytes, job.num_gpus)
            if reason:
                self.store.finish(job.id, "failed", f"cannot run on this server's slots: {reason}")
            else:
                fit.append(job)
        return fit

    def prepare(self, job: Job) -> JobDir:
        """The job's folder for a new attempt: its frozen recipe, its run and temp folders, its fence."""
        paths = self.paths(job.id)
        private_dir(paths.path)
        write_text_atomic(paths.recipe, job.config_yaml, mode=PRIVATE_FILE)  # what was accepted, whatever a stale directory holds
        runner.kill_leftovers(paths.run)
        for folder in (paths.run, paths.tmp):  # they must exist for the fence to let the job write them
            private_dir(folder)
        if self.sandboxed:
            self.policy(paths).save(paths.sandbox)
        return paths

    def policy(self, paths: JobDir) -> sandbox.Policy:
        """The job's fence: it writes its run directory and temp folder, reads its folder, the roots and caches."""
        return sandbox.job_policy(run_dir=paths.run, tmp_dir=paths.tmp, job_dir=paths.path,
                                  data_roots=self.data_roots, caches=[Path(c) for c in self.caches.values()],
                                  writable_caches=self.allow_hub_downloads, prepared=self.prepared)

    def job_env(self, job: Job) -> dict[str, str]:
        """The server's allow-listed environment, plus its tracking credentials when the job logs to a tracking
        server the operator allowed (checked again now: the allow-list may have changed since admission)."""
        try:
            doc = yaml.safe_load(job.config_yaml) or {}
            uri = ((doc.get("log") or {}).get("mlflow") or {}).get("tracking_uri")
        except (yaml.YAMLError, AttributeError):
            uri = None
        if isinstance(uri, str) and uri_allowed(uri, self.tracking_uri_allow):
            return {**self.env, **self.tracking_secrets}
        return dict(self.env)

    def note(self, job_id: int, text: str) -> None:
        """A line from the server in the job's log (the log tells the job's whole story)."""
        try:
            path = self.paths(job_id).log
            private_dir(path.parent)
            with open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE_FILE), "a") as f:
                f.write(f"{runner.LOG_HEADER} {text}\n")
        except OSError:
            pass

    # ------------------------------------------------------------ the slots as the dashboard shows them

    def slot_views(self) -> list[dict[str, Any]]:
        stats = gpu_stats() if any(s.kind == "gpu" for s in self.slots) else None
        running = self.store.running()
        views = []
        for slot in self.slots:
            jobs = [j for j in running if slot.id in j.slots]
            live = (stats or {}).get(slot.index) if slot.index is not None else None
            views.append({**slot.to_dict(), "reserved_bytes": sum(j.memory_bytes for j in jobs),
                          "jobs": [{"id": j.id, "name": j.name, "memory_bytes": j.memory_bytes} for j in jobs],
                          "live": live})
        return views


def private_dir(path: Path) -> None:
    """Create `path` (and parents) readable by this user only; an existing one is made so too."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)


class StateDirLock:
    """One server per state directory: an exclusive flock on <state>/server.lock, released when the process
    dies however it dies (the file descriptor is not inherited by job processes)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "server.lock"
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        private_dir(self.path.parent)
        fd = lock_file(self.path, wait=False, mode=PRIVATE_FILE)
        if fd is None:
            raise UserError(f"--state-dir: {self.path.parent} is in use by another trainforge server; stop it or "
                            "pick another --state-dir")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
