"""Tying a process's life to its parent's: Linux's PR_SET_PDEATHSIG.

    die_with_parent()     # from now on SIGKILL reaches this process when its parent dies

A child that outlives its parent holds what it held (a data worker: hundreds of MB of batches and the object
database) and may wait forever: a DataLoader worker whose parent was SIGKILLed (the OOM killer, `kill -9`, a job
queue's kill) with a batch larger than the pipe's buffer in flight blocks in its queue's feeder thread at exit, and
torch's check of the parent never runs again. A no-op outside Linux.
"""
from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """`sig` reaches this process when the thread that started it ends (its parent's death). Linux only."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
