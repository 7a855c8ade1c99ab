"""Splits: stratified proportions, random fallback, contiguous LM ranges, seeded."""
from __future__ import annotations

import numpy as np
import pytest

from trainforge.data.stages.split import can_stratify, carve_val, contiguous_split, random_split, split_counts
from trainforge.errors import UserError


def test_stratified_split_keeps_class_proportions():
    labels = np.array([0] * 800 + [1] * 150 + [2] * 50)
    splits, method = random_split(labels, len(labels), 0.15, 0.2, seed=3)
    assert method == "stratified"
    assert {k: len(v) for k, v in splits.items()} == {"train": 650, "val": 150, "test": 200}
    for name, frac in (("test", 0.2), ("val", 0.15)):
        counts = np.bincount(labels[splits[name]], minlength=3)
        np.testing.assert_allclose(counts, [800 * frac, 150 * frac, 50 * frac], atol=1.01)
    everything = np.concatenate(list(splits.values()))
    assert sorted(everything.tolist()) == list(range(1000))  # a partition: no overlap, nothing lost


def test_every_class_gets_its_share_within_one_on_random_label_sets():
    rng = np.random.default_rng(0)
    for trial in range(60):
        k = int(rng.integers(2, 15))
        labels = rng.integers(0, k, int(rng.integers(4 * k, 600))) if trial % 2 else np.repeat(
            np.arange(k), rng.integers(2, 40, k))  # uniform, and very uneven classes
        splits, method = random_split(labels, len(labels), 0.15, 0.2, seed=trial)
        assert sorted(np.concatenate(list(splits.values())).tolist()) == list(range(len(labels)))
        if method != "stratified":
            continue
        counts = np.bincount(labels, minlength=k)
        test_share = counts * len(splits["test"]) / len(labels)
        assert np.all(np.abs(np.bincount(labels[splits["test"]], minlength=k) - test_share) < 1)
        rest = np.setdiff1d(np.arange(len(labels)), splits["test"])
        val_share = np.bincount(labels[rest], minlength=k) * len(splits["val"]) / len(rest)
        assert np.all(np.abs(np.bincount(labels[splits["val"]], minlength=k) - val_share) < 1)
        assert all(np.all(np.diff(v) > 0) for v in splits.values())  # sorted


def test_split_is_a_function_of_the_seed():
    labels = np.arange(300) % 3
    a, _ = random_split(labels, 300, 0.1, 0.2, seed=1)
    b, _ = random_split(labels, 300, 0.1, 0.2, seed=1)
    c, _ = random_split(labels, 300, 0.1, 0.2, seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["test"], c["test"])


def test_random_when_a_class_is_too_small():
    labels = np.array([0] * 50 + [1] * 49 + [2])  # class 2 has one member: cannot be stratified
    splits, method = random_split(labels, 100, 0.1, 0.2, seed=0)
    assert method == "random"
    assert sum(len(v) for v in splits.values()) == 100
    assert not can_stratify(labels, 20) and can_stratify(labels[:99], 20)


def test_contiguous_split_is_ordered():
    splits = contiguous_split(100, 0.1, 0.2)
    assert splits["train"].tolist() == list(range(70))
    assert splits["val"].tolist() == list(range(70, 80))
    assert splits["test"].tolist() == list(range(80, 100))


def test_carve_val_keeps_the_given_test_split():
    labels = np.arange(60) % 2
    splits, _ = carve_val(labels, 60, np.arange(50, 60), 0.2, seed=0)
    assert splits["test"].tolist() == list(range(50, 60))
    assert len(splits["val"]) == 10 and len(splits["train"]) == 40
    assert set(splits["val"]).isdisjoint(splits["train"]) and max(splits["val"]) < 50


def test_too_few_samples_is_a_user_error():
    assert split_counts(10, 0.0, 0.0) == (10, 0, 0)
    with pytest.raises(UserError, match="only 2 usable samples"):
        split_counts(2, 0.5, 0.3)
