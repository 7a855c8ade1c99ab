"""Train/val/test index splits as pure functions of (labels or size, fractions, seed).

- classification: stratified (scikit-learn) wherever every class can be represented, else random;
- language modelling: contiguous ranges, so no window of the val/test text is trained on;
- a dataset's own test split is kept and only val is carved from its train part.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from trainforge.data.seeding import derive_seed
from trainforge.errors import UserError

Splits = dict[str, np.ndarray]


def split_counts(n: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    """(train, val, test) sizes; at least one training sample or a UserError."""
    n_test = int(round(n * test_fraction))
    n_val = int(round(n * val_fraction))
    n_train = n - n_val - n_test
    if n_train < 1:
        raise UserError(
            f"data: only {n} usable samples, too few to split with val_fraction={val_fraction} and "
            f"test_fraction={test_fraction}; add data or lower data.val_fraction/data.test_fraction",
            public=True,
        )
    return n_train, n_val, n_test


def can_stratify(labels: np.ndarray, holdout: int) -> bool:
    """scikit-learn's condition: every class has 2+ members and both parts can hold one of each."""
    _, counts = np.unique(labels, return_counts=True)
    k = len(counts)
    return bool(counts.min() >= 2 and k <= holdout <= len(labels) - k)


def _holdout(
    idx: np.ndarray, size: int, labels: Optional[np.ndarray], seed: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Split `idx` into (rest, holdout of `size`); reports whether it could stratify."""
    if size == 0:
        return idx, idx[:0], True
    from sklearn.model_selection import train_test_split  # heavy (about 1 s with pandas): only a holdout split needs it, never an LM's ranges

    stratify = labels is not None and can_stratify(labels, size)
    rest, held = train_test_split(
        idx, test_size=size, stratify=labels if stratify else None, random_state=seed % 2**32
    )
    return np.sort(rest), np.sort(held), stratify


def random_split(
    labels: Optional[np.ndarray], n: int, val_fraction: float, test_fraction: float, seed: int
) -> tuple[Splits, str]:
    """Seeded split of range(n); returns the splits and "stratified" or "random"."""
    _, n_val, n_test = split_counts(n, val_fraction, test_fraction)
    idx = np.arange(n)
    rest, test, strat_test = _holdout(idx, n_test, labels, derive_seed("split/test", seed))
    train, val, strat_val = _holdout(
        rest, n_val, None if labels is None else labels[rest], derive_seed("split/val", seed)
    )
    method = "stratified" if labels is not None and strat_test and strat_val else "random"
    return {"train": train, "val": val, "test": test}, method


def contiguous_split(n: int, val_fraction: float, test_fraction: float) -> Splits:
    """[train | val | test] in order: for sequences cut from one text, so splits never overlap."""
    n_train, n_val, _ = split_counts(n, val_fraction, test_fraction)
    idx = np.arange(n)
    return {"train": idx[:n_train], "val": idx[n_train : n_train + n_val], "test": idx[n_train + n_val :]}


def carve_val(
    labels: Optional[np.ndarray], n: int, test_indices: np.ndarray, val_fraction: float, seed: int
) -> tuple[Splits, str]:
    """Keep the dataset's own test split; take `val_fraction` of the remaining train part as val."""
    is_test = np.zeros(n, dtype=bool)
    is_test[test_indices] = True
    pool = np.flatnonzero(~is_test)
    n_val = int(round(len(pool) * val_fraction))
    if len(pool) - n_val < 1:
        raise UserError(f"data: the train split has only {len(pool)} samples; lower data.val_fraction", public=True)
    train, val, strat = _holdout(
        pool, n_val, None if labels is None else labels[pool], derive_seed("split/val", seed)
    )
    method = "dataset test split; val " + ("stratified" if labels is not None and strat else "random")
    return {"train": train, "val": val, "test": np.sort(np.asarray(test_indices))}, method
