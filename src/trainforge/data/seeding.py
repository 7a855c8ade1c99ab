"""Seeds derived from positions, so randomness depends on *where* a sample is, never on history.

    g = generator_for("augment", seed, epoch, index)   # same key -> same stream, in any process

Nothing here touches the global torch/numpy/python RNGs.
"""
from __future__ import annotations

import hashlib

import torch


def derive_seed(*key: int | str) -> int:
    """A 63-bit seed that is a pure function of `key` (a tag string plus integers)."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def generator_for(*key: int | str) -> torch.Generator:
    """A fresh CPU generator seeded by `derive_seed(*key)`."""
    return torch.Generator().manual_seed(derive_seed(*key))
