"""The parent of one job attempt: runs the trainer and records how it ended, even if the server is gone.

    python -m trainforge.jobs.wrapper --exit-file JOB/exit.json --attempt 3 [--sandbox JOB/sandbox.json] -- \
        python -m trainforge train ...

It leads the job's process group (the server starts it with start_new_session), so a cancel's SIGTERM to
the group reaches the trainer directly; the wrapper itself ignores SIGTERM/SIGINT/SIGHUP and keeps waiting
for the trainer's checkpoint. If the wrapper is SIGKILLed, the kernel SIGKILLs the trainer too
(PR_SET_PDEATHSIG), so no trainer ever runs unsupervised next to a restarted attempt.
With --sandbox, the trainer starts inside the fence that file describes (jobs/sandbox.py: Landlock), set up
between fork and exec so that the trainer's first instruction already runs fenced; the wrapper itself stays
outside it, to write exit.json into the job's folder, which the trainer may only read. A fence that cannot be
put up is one line in the log and exit status 126: the trainer never runs unfenced.
Exit status: the trainer's code, or 128+N when signal N killed it.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

from trainforge.files import write_json_atomic
from trainforge.jobs import sandbox as fence

PR_SET_PDEATHSIG = 1
EXIT_UNFENCED = 126  # "cannot execute": the fence could not be put up, so the trainer was not started


def _die_with_parent():
    """A preexec_fn: SIGKILL this child when its parent (the wrapper) dies; None where prctl is missing."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before fork: preexec_fn must not import
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the wrapper died between fork and prctl
            os._exit(128 + signal.SIGKILL)

    return preexec


def _preexec(sandbox: Optional[str]) -> Optional[Callable[[], None]]:
    """The child's set-up between fork and exec: die with the wrapper, then (with a sandbox file) the fence."""
    steps = [s for s in (_die_with_parent(), fence.preexec(fence.Policy.load(Path(sandbox))) if sandbox else None) if s]
    if not steps:
        return None

    def run() -> None:
        for step in steps:
            step()

    return run


def _write_exit(path: str, attempt: int, returncode: int) -> None:
    write_json_atomic(Path(path), {"attempt": attempt, "returncode": returncode})


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        sep = args.index("--")
        opts, command = args[:sep], args[sep + 1:]
        exit_file = opts[opts.index("--exit-file") + 1]
        attempt = int(opts[opts.index("--attempt") + 1])
        sandbox = opts[opts.index("--sandbox") + 1] if "--sandbox" in opts else None
    except (ValueError, IndexError):
        print("usage: python -m trainforge.jobs.wrapper --exit-file PATH --attempt N [--sandbox PATH] -- COMMAND...",
              file=sys.stderr)
        return 2
    if not command:
        print("wrapper: no command given", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # a Python handler, not SIG_IGN: the child's dispositions reset to default at exec
        signal.signal(sig, lambda *_: None)
    try:
        setup = _preexec(sandbox)
    except (fence.SandboxError, OSError, ValueError) as e:
        print(f"sandbox: the job cannot be fenced ({e}); it does not run without its fence", file=sys.stderr, flush=True)
        _write_exit(exit_file, attempt, EXIT_UNFENCED)
        return EXIT_UNFENCED
    proc = subprocess.Popen(command, preexec_fn=setup, close_fds=True)
    returncode = proc.wait()  # PEP 475: retried when a signal interrupts it
    _write_exit(exit_file, attempt, returncode)
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())
