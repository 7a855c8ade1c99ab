"""K worker processes that run trials until the study holds the wanted number of finished ones.

    run_workers(study, storage, spec, wanted=20, parallel=4, recipe_seed=0, on_trial=print_line)

Each worker (`python -m trainforge.tuning.worker`) gets its own GPU through CUDA_VISIBLE_DEVICES
(round-robin over the visible GPUs), or on a CPU-only machine its share of the cores
(train.num_threads = cpu_count // K). The coordinator hands out one trial at a time ("run"), so the
study ends with exactly `wanted` finished trials. A worker that dies mid-trial has that trial marked
FAIL and is replaced while trials remain; the others carry on.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

from trainforge.errors import JobFailed
from trainforge.hardware.cpus import available_cpus
from trainforge.tuning.study import count_finished, fail_dead_trials, sampler_seed

STOP_TIMEOUT_S = 60  # how long a stopping worker may take to checkpoint and exit before it is killed


@dataclass
class Placement:
    """Where the workers run: one GPU each (CUDA_VISIBLE_DEVICES), else a share of the CPU threads."""

    gpus: list[str]
    overrides: list[str]  # applied to every trial of every worker

    def env(self, index: int) -> dict[str, str]:
        env = dict(os.environ)
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[index % len(self.gpus)]
        return env


def placement(parallel: int, user_keys: set[str], gpu_count: Optional[int] = None,
              cpu_count: Optional[int] = None) -> Placement:
    """GPUs round-robin when there are any; else train.num_threads = max(1, cpu_count // parallel).

    A train.num_threads the user passed as an override is kept. With several workers the progress bars
    are turned off: K bars on one terminal would garble each other (each trial still logs its metrics).
    """
    if gpu_count is None:
        from trainforge.hardware.device import gpu_count as visible_gpus  # heavy (torch): only placement() needs it

        gpu_count = visible_gpus()
    overrides: list[str] = []
    gpus: list[str] = []
    if gpu_count >= 1:
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        gpus = visible[:gpu_count] if len(visible) >= gpu_count else [str(i) for i in range(gpu_count)]
    elif "train.num_threads" not in user_keys:
        overrides.append(f"train.num_threads={max(1, (cpu_count or available_cpus()) // parallel)}")
    if parallel > 1:
        overrides.append("log.progress=false")
    return Placement(gpus, overrides)


@dataclass
class _Worker:
    proc: subprocess.Popen
    index: int
    ready: bool = False
    ticket: bool = False  # asked to run a trial and not yet done
    started: Optional[int] = None  # the number of the trial it runs
    pending: bytes = b""  # read from its event pipe, not yet a whole line

    def read_events(self) -> Optional[list[dict[str, Any]]]:
        """The whole event lines now readable (raw reads: a buffered reader could sit on a line that select()
        no longer reports); None at end of file, i.e. the process exited."""
        assert self.proc.stdout is not None
        chunk = os.read(self.proc.stdout.fileno(), 65536)
        if not chunk:
            return None
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return events


def _spawn(index: int, spec: dict[str, Any], seed: int, place: Placement) -> _Worker:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainforge.tuning.worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=place.env(index),
    )
    worker = _Worker(proc, index)
    _send(worker, json.dumps({**spec, "sampler_seed": seed}))
    return worker


def _send(worker: _Worker, line: str) -> bool:
    try:
        assert worker.proc.stdin is not None
        worker.proc.stdin.write((line + "\n").encode())
        return True
    except (BrokenPipeError, OSError):  # it died; its end-of-file event follows
        return False


def run_workers(
    study: Any,
    storage: Any,
    spec: dict[str, Any],
    *,
    wanted: int,
    parallel: int,
    recipe_seed: int,
    place: Placement,
    on_trial: Callable[[int], None],
) -> None:
    """Run trials in `parallel` worker processes until `wanted` trials are finished (see study.is_finished).

    `spec` is the worker job (base_config, space, metric, out, storage, study, pruner, worker_overrides);
    `on_trial(number)` is called when a trial ends (also for one failed because its worker died).
    """
    from optuna.trial import TrialState  # heavy (optuna): loaded on first use

    existing = len(study.get_trials(deepcopy=False))
    spawned = 0
    workers: dict[int, _Worker] = {}  # by pid
    selector = selectors.DefaultSelector()

    def spawn(index: int) -> None:
        nonlocal spawned
        w = _spawn(index, spec, sampler_seed(recipe_seed, existing, spawned), place)
        spawned += 1
        workers[w.proc.pid] = w
        selector.register(w.proc.stdout, selectors.EVENT_READ, w)

    def can_dispatch() -> bool:
        # finished + running (here or on other machines sharing the storage) + asked-but-not-started
        trials = study.get_trials(deepcopy=False)
        running = sum(1 for t in trials if t.state == TrialState.RUNNING)
        pending = sum(1 for w in workers.values() if w.ticket and w.started is None)
        return count_finished(trials) + running + pending < wanted

    def on_exit(w: _Worker) -> None:
        selector.unregister(w.proc.stdout)
        code = w.proc.wait()
        del workers[w.proc.pid]
        if not w.ready:
            raise JobFailed(f"tune worker {w.index} exited with code {code} before it could run a trial; "
                            "see its messages above")
        if w.ticket:
            why = f"worker died: its process exited with code {code} during the trial"
            for number in fail_dead_trials(study, storage, pids={w.proc.pid}, reason=lambda t: why):
                on_trial(number)
        if can_dispatch():
            spawn(w.index)  # a replacement on the same GPU

    interrupted = False
    try:
        for index in range(parallel):
            spawn(index)
        while True:
            for w in list(workers.values()):
                if w.ready and not w.ticket and can_dispatch():
                    w.ticket = _send(w, "run")
            if not any(w.ticket for w in workers.values()) and not (workers and can_dispatch()):
                break  # nothing in flight and nothing more to run (workers still starting up are waited for)
            for key, _ in selector.select():
                w = key.data
                events = w.read_events()
                if events is None:
                    on_exit(w)
                    continue
                for event in events:
                    if event.get("event") == "ready":
                        w.ready = True
                    elif event.get("event") == "started":
                        w.started = event["number"]
                    elif event.get("event") == "finished":
                        w.ticket, w.started = False, None
                        if event.get("number") is not None:
                            on_trial(event["number"])
    except KeyboardInterrupt:
        interrupted = True  # Ctrl-C reached the workers too (one process group): each stops its trial
        raise
    finally:
        _stop(list(workers.values()), terminate_busy=not interrupted)
        selector.close()


def _stop(workers: list[_Worker], terminate_busy: bool) -> None:
    """End of input tells idle workers to exit. After an error here, busy ones get SIGTERM: the training loop
    stops after its step and the trial is recorded as interrupted. Stragglers are killed."""
    for w in workers:
        if terminate_busy and w.ticket and w.proc.poll() is None:
            try:
                w.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            if w.proc.stdin is not None:
                w.proc.stdin.close()
        except OSError:
            pass
    for w in workers:
        try:
            w.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
        if w.proc.stdout is not None:
            w.proc.stdout.close()
