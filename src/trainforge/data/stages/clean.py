"""Cleaning of in-memory samples: non-finite rows and exact duplicates, each drop counted.

Source-specific problems (corrupt files, bad labels, empty texts) are dropped by the sources
themselves, into the same `DropLog`.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable, Optional

import numpy as np
import torch

from trainforge.config import CleanConfig

from trainforge.data.samples import DropLog, Pool


def first_occurrences(hashes: Iterable[bytes]) -> np.ndarray:
    """Boolean mask keeping the first sample of every distinct hash."""
    seen: set[bytes] = set()
    keep = []
    for h in hashes:
        keep.append(h not in seen)
        seen.add(h)
    return np.asarray(keep, dtype=bool)


def row_hashes(x: torch.Tensor) -> list[bytes]:
    """SHA-256 of each sample's bytes (the label is not part of it: same input = duplicate)."""
    rows = x.flatten(1).contiguous().numpy()
    return [hashlib.sha256(row.tobytes()).digest() for row in rows]


def finite_rows(x: torch.Tensor) -> np.ndarray:
    if not x.is_floating_point():
        return np.ones(len(x), dtype=bool)
    return torch.isfinite(x.flatten(1)).all(dim=1).numpy()


def clean_tensor_pool(pool: Pool, cfg: CleanConfig) -> Pool:
    """Drop non-finite rows, then exact duplicates (keeping the first), per `cfg`; counts go to pool.drops."""
    samples = pool.samples
    assert pool.test_indices is None
    keep = np.ones(len(samples), dtype=bool)
    if cfg.drop_nonfinite:
        _drop(pool.drops, "nonfinite", samples, keep, finite_rows(samples.x))
    if cfg.dedup:
        kept = np.flatnonzero(keep)
        unique = np.zeros(len(samples), dtype=bool)
        unique[kept] = first_occurrences(row_hashes(samples.x[torch.as_tensor(kept)]))
        _drop(pool.drops, "duplicate", samples, keep, unique)
    return _keep_only(pool, keep)


FAILED_BEFORE_KEY = "dropped_failed_before"  # in the stored preprocessing: the files a run dropped for that


def drop_failed_before(pool: Pool, stored: Optional[dict[str, Any]]) -> Pool:
    """Drop, as corrupt, the samples an earlier run could not read (`pool.failed_before`). A resumed or evaluated
    run (`stored`: its preprocessing record) drops exactly those its start dropped, so its split stays the same;
    any other such sample stays, and is replaced at run time as it was then."""
    assert pool.failed_before is not None
    ids = pool.samples.ids
    if stored is not None:
        before = set(stored.get(FAILED_BEFORE_KEY, ()))
        drop = [int(i) for i in pool.failed_before if ids[i] in before]
    else:
        drop = [int(i) for i in pool.failed_before]
    pool.failed_before = None
    if drop:
        pool.preprocess = {**pool.preprocess, FAILED_BEFORE_KEY: [ids[i] for i in drop]}
        keep = np.ones(len(pool.samples), dtype=bool)
        ok = keep.copy()
        ok[drop] = False
        _drop(pool.drops, "corrupt", pool.samples, keep, ok)
        pool = _keep_only(pool, keep)
    return pool


def _keep_only(pool: Pool, keep: np.ndarray) -> Pool:
    """The pool with only the samples (and their labels and groups) `keep` marks."""
    if keep.all():
        return pool
    idx = np.flatnonzero(keep)
    pool.samples = pool.samples.subset(idx)
    if pool.labels is not None:
        pool.labels = pool.labels[idx]
    if pool.groups is not None:
        pool.groups = pool.groups[idx]
    return pool


def _drop(log: DropLog, reason: str, samples: Any, keep: np.ndarray,
          ok: np.ndarray) -> None:
    for i in np.flatnonzero(keep & ~ok):
        log.drop(reason, samples.ids[i])
    keep &= ok


def clean_text_pool(pool: Pool, cfg: CleanConfig) -> Pool:
    """Drop exact duplicate texts (keeping the first), per `cfg`; before tokenization, so before the split."""
    samples = pool.samples
    if not cfg.dedup:
        return pool
    keep = np.ones(len(samples), dtype=bool)
    _drop(pool.drops, "duplicate", samples, keep,
          first_occurrences(hashlib.sha256(t.encode("utf-8")).digest() for t in samples.texts))
    return _keep_only(pool, keep)
