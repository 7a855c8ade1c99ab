"""The CPUs this process may run on: how many worker processes the data stage starts (a folder's scan, token shards,
WebDataset shards, `data.num_workers: auto`). Standard library only: the token shards' pool workers import it."""
from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs of this process' affinity mask (what taskset, a container's cpuset or Slurm leaves it), else every
    CPU of the machine where the mask cannot be read (not on Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
