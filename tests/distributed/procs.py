"""Process helpers shared by the multi-process tests."""
from __future__ import annotations


def children(pid: int) -> list[int]:
    """The direct children of `pid` (Linux /proc); [] once it has none or is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []
