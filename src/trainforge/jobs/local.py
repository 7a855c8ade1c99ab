"""The local backend of the job server: jobs run as processes on this machine's slots.

    backend = LocalBackend(service)      # JobService holds one backend: this, or jobs/cluster.py's ClusterBackend
    backend.reconcile()                  # after a start: adopt live processes, judge the ones that are gone
    backend.tick()                       # each poll: watch running jobs, then start what fits
    backend.cancel(job)                  # queued: cancelled now; running: SIGTERM, SIGKILL after the grace

A backend places and runs jobs; the service keeps everything else (admission, the queue, restarts through `settle`,
logs, views). Each backend answers the same four calls and its `name`, so the service never asks which it holds.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Any, Optional, Protocol

from trainforge.jobs import runner
from trainforge.jobs.scheduler import Pending, Placed, assign
from trainforge.jobs.store import Job

if TYPE_CHECKING:
    from trainforge.jobs.store import Store

log = logging.getLogger("trainforge.jobs")


class Backend(Protocol):
    name: str

    def tick(self) -> None: ...

    def reconcile(self) -> None: ...

    def cancel(self, job: Job) -> Job: ...

    def origin(self, job: Job) -> str: ...


class LocalBackend:
    name = "local"

    def __init__(self, service: Any) -> None:
        self.service = service  # the JobService (store, paths, prepare, job_env, settle, note, slots)
        self.popens: dict[int, subprocess.Popen] = {}
        self.cancel_deadline: dict[int, float] = {}

    @property
    def store(self) -> "Store":
        return self.service.store

    def origin(self, job: Job) -> str:
        return self.name

    def tick(self) -> None:
        for job in self.store.running():
            self._watch(job)
        self.schedule()

    def reconcile(self) -> None:
        for job in self.store.running():
            paths = self.service.paths(job.id)
            if job.pid and runner.is_ours(job.pid, job.pid_start_ticks, paths.run):
                self.service.note(job.id, f"adopted by a restarted server (pid {job.pid})")
                continue
            if self._readopt(job):
                continue
            if job.pid is None and runner.read_exit(paths, job.attempt) is None:
                # claimed but never started (the server died in between): no attempt to count
                self.store.requeue(job.id, job.reason, count_restart=False, resume=job.resume)
                continue
            self._ended(job, None)

    def cancel(self, job: Job) -> Job:
        if job.state == "queued":
            self.store.finish(job.id, "cancelled", "cancelled by the user")
        elif job.state == "running":
            self.store.request_cancel(job.id)
            if job.pid:
                runner.signal_job(job.pid, signal.SIGTERM)
            self.cancel_deadline[job.id] = time.monotonic() + self.service.cancel_grace_s
            self.service.note(job.id, "cancel requested: SIGTERM sent to the job's processes")
        return self.service.get(job.id)

    def _readopt(self, job: Job) -> bool:
        """Another live process of the job (e.g. started just before a crash): watch that one."""
        pids = runner.job_processes(self.service.paths(job.id).run)
        if not pids:
            return False
        leader = next((p for p in pids if _pgid(p) == p), pids[0])
        self.store.set_process(job.id, leader, runner.start_ticks(leader))
        self.service.note(job.id, f"adopted process {leader} of this job")
        return True

    def _watch(self, job: Job) -> None:
        popen = self.popens.get(job.id)
        if popen is not None:
            alive = popen.poll() is None
        else:
            alive = runner.is_ours(job.pid, job.pid_start_ticks, self.service.paths(job.id).run)
            if not alive and self._readopt(job):
                return
        if alive:
            if job.cancel_requested:
                self._push_cancel(job)
            return
        wrapper_rc = popen.returncode if popen is not None else None
        self._ended(job, wrapper_rc)

    def _push_cancel(self, job: Job) -> None:
        deadline = self.cancel_deadline.get(job.id)
        if deadline is None:  # requested before a server restart: ask again
            runner.signal_job(job.pid, signal.SIGTERM)
            self.cancel_deadline[job.id] = time.monotonic() + self.service.cancel_grace_s
        elif time.monotonic() > deadline:
            self.service.note(job.id, f"no exit {self.service.cancel_grace_s:.0f} s after SIGTERM: SIGKILL")
            runner.signal_job(job.pid, signal.SIGKILL)
            self.cancel_deadline[job.id] = time.monotonic() + self.service.cancel_grace_s

    def _ended(self, job: Job, wrapper_rc: Optional[int]) -> None:
        """An attempt is over: decide succeeded / cancelled / restart / failed."""
        paths = self.service.paths(job.id)
        self.popens.pop(job.id, None)
        self.cancel_deadline.pop(job.id, None)
        runner.kill_leftovers(paths.run)  # e.g. an orphaned torchrun worker: never two attempts at once
        rc = runner.read_exit(paths, job.attempt)
        if rc is None and wrapper_rc is not None and wrapper_rc < 0:
            rc = wrapper_rc  # the wrapper itself was killed (and took the trainer with it)
        self.service.settle(job, rc)

    def schedule(self) -> None:
        queued = self.store.queued()
        if not queued:
            return
        capacity = {s.id: s.memory_bytes for s in self.service.slots}
        queued = self.service.drop_unfit(queued)
        running = [Placed(tuple(j.slots), j.memory_bytes) for j in self.store.running()]
        pending = [Pending(j.id, j.priority, j.num_gpus, j.memory_bytes) for j in queued]
        for job_id, slot_ids in assign(pending, capacity, running, self.service.placement):
            if self.store.claim(job_id, slot_ids):
                self._launch(self.service.get(job_id))

    def _launch(self, job: Job) -> None:
        slots = [self.service.slot_by_id[s] for s in job.slots]
        try:
            paths = self.service.prepare(job)
            argv = runner.train_argv(self.service.python, paths, slots, resume=job.resume)
            header = (f"attempt {job.attempt} on {', '.join(job.slots)} at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                      f"{' '.join(argv[1:])}")
            popen = runner.start_attempt(paths, runner.wrapped_argv(self.service.python, paths, job.attempt, argv,
                                                                    sandboxed=self.service.sandboxed),
                                         runner.job_env(self.service.job_env(job), slots, paths), header)
        except OSError as e:
            self.store.finish(job.id, "failed", f"cannot start the job's process: {e}")
            log.error("job %d: cannot start: %s", job.id, e)
            return
        self.popens[job.id] = popen
        self.store.set_process(job.id, popen.pid, runner.start_ticks(popen.pid))
        log.info("job %d attempt %d started on %s (pid %d)", job.id, job.attempt, ",".join(job.slots), popen.pid)


def _pgid(pid: int) -> Optional[int]:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
