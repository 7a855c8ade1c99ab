"""Train/val/test index splits as pure functions of (labels or size, fractions, seed).

- classification: stratified wherever every class can be represented, else random;
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
    """Every class has 2+ members and both parts can hold one of each (scikit-learn's condition too)."""
    _, counts = np.unique(labels, return_counts=True)
    k = len(counts)
    return bool(counts.min() >= 2 and k <= holdout <= len(labels) - k)


def _holdout(
    idx: np.ndarray, size: int, labels: Optional[np.ndarray], seed: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Split `idx` into (rest, holdout of `size`), both sorted; reports whether it could stratify.

    Stratified: each class gives the holdout its proportional share, rounded down, and the samples still
    missing go to the classes with the largest remainders (ties drawn by the seed), so every class's count
    is within one of its exact share; within a class the members are a seeded draw. Written here rather
    than taken from scikit-learn's `train_test_split`: importing scikit-learn cost every run's start 1.2 s.
    """
    if size == 0:
        return idx, idx[:0], True
    rng = np.random.default_rng(seed)
    stratify = labels is not None and can_stratify(labels, size)
    if stratify:
        _, inverse = np.unique(labels, return_inverse=True)
        members = [np.flatnonzero(inverse == c) for c in range(int(inverse.max()) + 1)]
        share = np.array([len(m) for m in members]) * size / len(idx)
        take = np.floor(share).astype(np.int64)
        by_remainder = np.lexsort((rng.random(len(members)), -(share - take)))
        take[by_remainder[: size - int(take.sum())]] += 1
        chosen = np.concatenate([m[rng.permutation(len(m))[:k]] for m, k in zip(members, take)])
    else:
        chosen = rng.permutation(len(idx))[:size]
    held = np.zeros(len(idx), dtype=bool)
    held[chosen] = True
    return np.sort(idx[~held]), np.sort(idx[held]), stratify


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


def index_dtype(n: int) -> type:
    """The smallest integer type that holds indices below `n` (int32 up to 2**31 samples)."""
    return np.int32 if n < 2**31 else np.int64


def contiguous_split(n: int, val_fraction: float, test_fraction: float) -> Splits:
    """[train | val | test] in order: for sequences cut from one text, so splits never overlap."""
    n_train, n_val, _ = split_counts(n, val_fraction, test_fraction)
    idx = np.arange(n, dtype=index_dtype(n))  # a large corpus' windows: 4 bytes each, not 8
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


def group_split(
    labels: Optional[np.ndarray], groups: np.ndarray, val_fraction: float, test_fraction: float, seed: int,
    column: str,
) -> tuple[Splits, str]:
    """Seeded split of whole groups (`data.group_by`: every sample of a patient in one split): the val and test
    parts take round(fraction x groups) groups each, drawn as `_holdout` draws samples; stratified by each group's
    most common label wherever every label can be represented, else at random. Returns sample indices per split."""
    names, of_sample = np.unique(groups, return_inverse=True)
    n_groups = len(names)
    n_test = int(round(n_groups * test_fraction))
    n_val = int(round(n_groups * val_fraction))
    if n_groups - n_val - n_test < 1:
        raise UserError(
            f"data.group_by: only {n_groups} distinct {column} values, too few to split whole groups with "
            f"val_fraction={val_fraction} and test_fraction={test_fraction}; add data, lower the fractions, or "
            "group by another column", public=True)
    group_labels = None
    if labels is not None:  # each group's most common label (ties: the lowest)
        counts = np.zeros((n_groups, int(labels.max()) + 1), dtype=np.int64)
        np.add.at(counts, (of_sample, labels), 1)
        group_labels = counts.argmax(axis=1)
    idx = np.arange(n_groups)
    rest, test, strat_test = _holdout(idx, n_test, group_labels, derive_seed("split/test/groups", seed))
    train, val, strat_val = _holdout(rest, n_val, None if group_labels is None else group_labels[rest],
                                     derive_seed("split/val/groups", seed))
    part = np.empty(n_groups, dtype=np.int64)
    for k, chosen in enumerate((train, val, test)):
        part[chosen] = k
    of = part[of_sample]
    splits = {name: np.flatnonzero(of == k) for k, name in enumerate(("train", "val", "test"))}
    stratified = group_labels is not None and strat_test and strat_val
    return splits, f"grouped by {column}, " + ("stratified" if stratified else "random")


def groups_per_split(groups: np.ndarray, splits: Splits) -> dict[str, int]:
    """How many distinct groups each split holds; an AssertionError if any group is in two splits (it never is:
    `group_split` assigns groups, not samples; the data report states it was checked)."""
    seen: dict[str, str] = {}
    for name, idx in splits.items():
        for g in np.unique(groups[idx]).tolist():
            assert seen.setdefault(g, name) == name, f"group {g!r} is in the {seen[g]} and {name} splits"
    return {name: int(len(np.unique(groups[idx]))) for name, idx in splits.items()}
