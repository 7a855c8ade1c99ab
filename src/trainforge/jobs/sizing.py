"""Sizing a submission off the server's threads: one child process per check, with a time and a memory cap.

    checker = SizeChecker(data_roots=roots, timeout_s=120, memory_bytes=4 * 2**30, max_parallel=4)
    checker.warm()                                    # start the fork server now, not on the first submission
    admitted = checker.size(cfg, num_gpus=1, slots=slots, submitter="uid 1000")   # blocks this thread only;
                                                      # UserError on any failure, Busy (503) when no slot is free

Reading a submission's data and simulating its model can take long and much memory (a folder of a million
images, a synthetic set of a billion samples). So it happens in a child forked from a fork server that has
imported torch and the planner once (a check starts in milliseconds), with RLIMIT_AS capping its memory, a
deadline after which it is killed, and at most `max_parallel` checks at a time: another submission is
answered at once with "busy" instead of waiting behind a slow one. One submitter (`jobs.peers.submitter`: the Unix
user of a loopback client, else the client's address) holds at most `max_parallel - 1` of those slots
(`CheckSlots`), so one slot always stays open for everyone else: a user submitting checks that take long makes
only their own further submissions busy. A slot is worth little without a core, so the checks of a submitter
running two at once run at nice +5, three at once at +10 (all of theirs, the earlier ones reniced): another user's
check, at the server's own priority, gets its core while they run. The child reports only a public line
(`errors.public_message`); its full error goes to the server's log. It runs with the data roots and the hub
settings of the jobs (`pretrained.hub_env`: offline unless the operator allowed downloads) in an empty folder
of its own, so no relative name a submission gives reaches a file of the server's working directory, and inside
the job's fence made read-only (jobs/sandbox.py: it reads the roots, the caches and the software, and writes only
that folder, its cache included): whatever the data sources' checks miss, the check cannot read it either.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import tempfile
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from trainforge.config import config_from_yaml_text
from trainforge.confine import ENV as ROOTS_ENV
from trainforge.confine import roots_env
from trainforge.errors import UserError
from trainforge.hub import use_modules_cache
from trainforge.files import HOME_ENV
from trainforge.jobs import sandbox
from trainforge.jobs.pretrained import apply_hub_env, hub_env
from trainforge.jobs.serverlog import log_to
from trainforge.jobs.slots import Slot

if TYPE_CHECKING:
    from trainforge.jobs.admission import Admitted

log = logging.getLogger("trainforge.jobs")

CONTEXT = multiprocessing.get_context("forkserver")
# torch, data sources and planner, imported once, with what a check uses that they import lazily (a training
# process that does not need them starts faster): the planner's memory trackers and torchvision (image
# augmentation, the torchvision source and ResNets). Without them every check would import them again (about 3 s).
CONTEXT.set_forkserver_preload(["trainforge.jobs.admission", "trainforge.planning.trackers", "torchvision"])

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_MEMORY_BYTES = 4 * 2**30
DEFAULT_PARALLEL = 4
NICE_PER_CHECK = 5  # a submitter's checks, k at once, all run 5 x (k - 1) nicer than the server: 0, 5, 10


class Busy(UserError):
    """Every check slot is taken: the client should retry (HTTP 503)."""


class CheckSlots:
    """At most `total` checks at once, and at most `total - 1` for one submitter when `total` > 1; the checks of a
    submitter running k at once all run NICE_PER_CHECK x (k - 1) below the server's CPU priority."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.per_submitter = total - 1 if total > 1 else total
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()
        self._pids: dict[str, set[int]] = {}

    def in_use(self, submitter: str | None = None) -> int:
        with self._lock:
            return sum(self._held.values()) if submitter is None else self._held[submitter]

    @contextmanager
    def hold(self, submitter: str) -> Iterator[Callable[[int], None]]:
        """One slot for `submitter` while the block runs; Busy at once when none is free for them. Yields a
        function to call with the check's process id once it runs, which sets the CPU priority of their checks."""
        with self._lock:
            if sum(self._held.values()) >= self.total:
                raise Busy(f"the server is checking {self.total} submissions already; retry in a few seconds",
                           public=True)
            if self._held[submitter] >= self.per_submitter:
                raise Busy(f"you have {self._held[submitter]} submissions being checked already, the most one user "
                           "may have at once (the other slots stay open for others); retry when one is answered",
                           public=True)
            self._held[submitter] += 1
        pids = []

        def started(pid: int) -> None:
            with self._lock:
                pids.append(pid)
                theirs = self._pids.setdefault(submitter, set())
                theirs.add(pid)
                _lower_priority(theirs, NICE_PER_CHECK * (len(theirs) - 1))

        try:
            yield started
        finally:
            with self._lock:
                self._held[submitter] -= 1
                if not self._held[submitter]:
                    del self._held[submitter]
                theirs = self._pids.get(submitter)
                if theirs is not None:
                    theirs.difference_update(pids)
                    if not theirs:
                        del self._pids[submitter]


def _lower_priority(pids: set[int], nice: int) -> None:
    """Each of `pids` at least `nice` below this process's CPU priority (raising a niceness needs no privilege;
    it is never lowered again, as that would)."""
    if nice <= 0:
        return
    target = min(os.getpriority(os.PRIO_PROCESS, 0) + nice, 19)
    for pid in pids:
        try:
            if os.getpriority(os.PRIO_PROCESS, pid) < target:
                os.setpriority(os.PRIO_PROCESS, pid, target)
        except OSError:  # ended meanwhile
            pass


@dataclass(frozen=True)
class Fence:
    """A check's sandbox: it reads the data roots and caches; it writes its temp folder and `prepared`."""

    data_roots: tuple[Path, ...]
    caches: tuple[Path, ...]
    prepared: Optional[Path]
    # on a cluster backend: the engine's daemons' ports, which a model's own code must not reach (None: not known
    # yet, so no TCP at all); () on the local backend
    denied_tcp_ports: Optional[tuple[int, ...]] = ()


class SizeChecker:
    def __init__(self, *, data_roots: Sequence[Path] = (), timeout_s: float = DEFAULT_TIMEOUT_S,
                 memory_bytes: int = DEFAULT_MEMORY_BYTES, max_parallel: int = DEFAULT_PARALLEL,
                 allow_hub_downloads: bool = False, caches: Sequence[str] = (), sandboxed: bool = True,
                 prepared: Optional[Path] = None) -> None:
        self.child_env = {ROOTS_ENV: roots_env(data_roots), **hub_env(allow_hub_downloads)}
        if prepared is not None:  # what a check prepares (manifests, token shards) is kept there for the jobs
            self.child_env[HOME_ENV] = str(prepared)
        self.fence = Fence(tuple(data_roots), tuple(Path(c) for c in caches), prepared) if sandboxed else None
        self.timeout_s = timeout_s
        self.memory_bytes = memory_bytes
        self.max_parallel = max_parallel
        self.slots = CheckSlots(max_parallel)

    def warm(self) -> None:
        proc = CONTEXT.Process(target=_noop, daemon=True)
        proc.start()
        proc.join()

    def size(self, cfg_yaml: str, num_gpus: int, slots: Sequence[Slot], *, submitter: str = "local") -> Admitted:
        with self.slots.hold(submitter) as started:
            return self._run(cfg_yaml, num_gpus, list(slots), started)

    def _run(self, cfg_yaml: str, num_gpus: int, slots: list[Slot],
             started: Callable[[int], None] = lambda pid: None) -> Admitted:
        # the check's own folder, made and removed here: inside its fence the child may write in it, not remove it
        with tempfile.TemporaryDirectory(prefix="trainforge-check-") as workdir:
            return self._run_in(workdir, cfg_yaml, num_gpus, slots, started)

    def _run_in(self, workdir: str, cfg_yaml: str, num_gpus: int, slots: list[Slot],
                started: Callable[[int], None]) -> Admitted:
        receive, send = CONTEXT.Pipe(duplex=False)
        proc = CONTEXT.Process(target=_check, args=(send, workdir, cfg_yaml, num_gpus, slots, self.child_env,
                                                    self.memory_bytes, self.fence),
                               daemon=True, name="trainforge-size-check")
        proc.start()
        started(proc.pid)
        send.close()
        try:
            if not receive.poll(self.timeout_s):
                proc.kill()
                raise UserError(f"data: checking this submission took longer than {self.timeout_s:.0f} s (its data is "
                                "read to size the job); use less data, or ask the operator for a longer "
                                "--admission-timeout-s", public=True)
            try:
                kind, payload = receive.recv()
            except EOFError:
                proc.join()
                raise UserError(f"data: the check of this submission ended abruptly (exit {proc.exitcode}); it may "
                                f"need more than the {self.memory_bytes / 2**30:.1f} GiB a check may use", public=True) from None
        finally:
            receive.close()
            proc.join(timeout=10)
        if kind == "ok":
            return payload
        if kind == "memory":
            raise UserError(f"data: checking this submission needs more than the {self.memory_bytes / 2**30:.1f} GiB "
                            "of memory a check may use; use less data or a smaller model", public=True)
        raise UserError(payload, public=True)


def _noop() -> None:
    pass


def _cap_memory(extra_bytes: int) -> None:
    """RLIMIT_AS at what the process maps now (torch's libraries) plus `extra_bytes`."""
    import resource  # POSIX only; the server runs on Linux

    with open("/proc/self/statm") as f:
        mapped_bytes = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = mapped_bytes + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _check(conn: Any, workdir: str, cfg_yaml: str, num_gpus: int, slots: list[Slot], env: dict[str, str],
           memory_bytes: int, fence: Optional[Fence]) -> None:
    """In the child: size the submission and send ("ok", Admitted) or (kind, one public line)."""
    with log_to(sys.stderr, logging.WARNING):  # the server's stderr, escaped like its own log: errors may quote data
        _size_and_send(conn, workdir, cfg_yaml, num_gpus, slots, env, memory_bytes, fence)


def _size_and_send(conn: Any, workdir: str, cfg_yaml: str, num_gpus: int, slots: list[Slot], env: dict[str, str],
                   memory_bytes: int, fence: Optional[Fence]) -> None:
    import torch  # heavy: the fork server preloads these, the server process itself need not wait for them

    from trainforge.jobs.admission import size_submission  # heavy (torch): loaded in the child, as above

    try:
        torch.set_num_threads(1)  # one core per check: the server and the running jobs keep theirs
        apply_hub_env(env)  # the data sources enforce the roots, and the hub stays offline, as in the job itself
        os.chdir(workdir)  # empty: a relative name ("org/name") can only be a hub id, never a folder of ours
        os.environ.update(TMPDIR=workdir, TRAINFORGE_HOME=env.get(HOME_ENV) or os.path.join(workdir, "trainforge"))
        use_modules_cache(Path(workdir) / "hf-modules")  # a model's own code, where the server allows it: this check's
        tempfile.tempdir = workdir  # the fork server may have looked it up already
        if fence is not None:  # the job's fence, read-only but for workdir and the cache of prepared data
            sandbox.restrict(sandbox.check_policy(tmp_dir=Path(workdir), data_roots=fence.data_roots,
                                                  caches=fence.caches, prepared=fence.prepared,
                                                  denied_tcp_ports=fence.denied_tcp_ports or (),
                                                  deny_all_tcp=fence.denied_tcp_ports is None))
        _cap_memory(memory_bytes)
        result: tuple[str, Any] = ("ok", size_submission(config_from_yaml_text(cfg_yaml), num_gpus, slots))
    except UserError as e:
        shown = e.public if isinstance(e.public, str) else str(e)
        if shown != str(e):  # the operator sees what the submitter may not (the fork server's stderr is the server's)
            log.warning("submission refused: %s", e)
        result = ("error", shown)
    except MemoryError:
        result = ("memory", "")
    except Exception as e:  # noqa: BLE001 - a crash in the check is the submission's problem, never the server's
        if "can't allocate memory" in str(e) or "out of memory" in str(e).lower():
            result = ("memory", "")
        else:
            log.exception("size check failed")
            result = ("error", f"the check of this submission failed ({type(e).__name__}); the server's log has "
                               "the details")
    conn.send(result)
    conn.close()
