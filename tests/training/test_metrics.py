from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

from trainforge.errors import UserError
from trainforge.engine.metrics import (
    MetricsLog,
    classification_metrics,
    json_safe,
    lm_metrics,
    read_metrics,
)

NAMES = ["cat", "dog", "fox", "owl"]  # "owl" never occurs: the absent class


def _strict_loads(line: str):
    def reject(constant: str):
        raise AssertionError(f"non-standard JSON constant {constant}")

    return json.loads(line, parse_constant=reject)


# ---------------------------------------------------------------- classification


def test_classification_metrics_match_hand_computed_values():
    y_true = np.array([0, 1, 2, 1, 0])
    y_pred = np.array([0, 1, 1, 1, 2])
    m = classification_metrics(y_true, y_pred, NAMES)

    assert m["accuracy"] == pytest.approx(3 / 5)
    # rows = true, cols = predicted; the absent class keeps its zero row and column
    assert m["confusion_matrix"] == [[1, 0, 1, 0], [0, 2, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]
    cat, dog, fox, owl = (m["per_class"][n] for n in NAMES)
    assert (cat["precision"], cat["recall"], cat["f1"], cat["support"]) == pytest.approx((1.0, 0.5, 2 / 3, 2))
    assert (dog["precision"], dog["recall"], dog["f1"], dog["support"]) == pytest.approx((2 / 3, 1.0, 0.8, 2))
    assert (fox["precision"], fox["recall"], fox["f1"], fox["support"]) == (0.0, 0.0, 0.0, 1)
    assert owl == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    # macro over classes that occur (cat, dog, fox); the absent owl does not drag it down
    assert m["macro_f1"] == pytest.approx((2 / 3 + 0.8 + 0.0) / 3)
    assert m["class_names"] == NAMES
    assert list(m["per_class"]) == NAMES
    json.dumps(m, allow_nan=False)  # eval.json-ready: plain Python types only


def test_classification_metrics_equal_scikit_learn_on_random_predictions():
    """Computed from the confusion matrix with numpy (no scikit-learn import in a training process); the
    same numbers as scikit-learn's, absent and never-predicted classes included."""
    from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

    rng = np.random.default_rng(7)
    for trial in range(40):
        k = int(rng.integers(2, 12))
        n = int(rng.integers(1, 300))
        y_true = rng.integers(0, k, n) if trial % 3 else rng.integers(0, max(1, k // 2), n)  # some classes absent
        y_pred = np.where(rng.random(n) < 0.6, y_true, rng.integers(0, k, n))
        m = classification_metrics(y_true, y_pred, [f"c{i}" for i in range(k)])
        labels = list(range(k))
        assert m["confusion_matrix"] == confusion_matrix(y_true, y_pred, labels=labels).tolist()
        p, r, f, s = precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
        got = [[m["per_class"][f"c{i}"][key] for i in range(k)] for key in ("precision", "recall", "f1", "support")]
        np.testing.assert_allclose(got, [p, r, f, s], rtol=0, atol=1e-12)
        assert m["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro", zero_division=0), abs=1e-12)


def test_perfect_predictions_score_one():
    y = np.array([3, 0, 1, 1])
    m = classification_metrics(y, y.copy(), NAMES)
    assert m["accuracy"] == 1.0 and m["macro_f1"] == 1.0
    assert np.trace(np.array(m["confusion_matrix"])) == 4


def test_label_outside_class_range_is_a_user_error():
    with pytest.raises(UserError, match="outside 0..3"):
        classification_metrics(np.array([0, 4]), np.array([0, 1]), NAMES)


def test_empty_split_gives_nan_scores_and_zero_matrix():
    m = classification_metrics(np.array([], dtype=np.int64), np.array([], dtype=np.int64), NAMES)
    assert math.isnan(m["accuracy"]) and math.isnan(m["macro_f1"])
    assert m["confusion_matrix"] == [[0] * 4 for _ in range(4)]


# ---------------------------------------------------------------- lm + running mean


def test_perplexity_is_exp_of_loss_and_never_overflows():
    assert lm_metrics(math.log(10.0))["perplexity"] == pytest.approx(10.0)
    assert lm_metrics(0.0)["perplexity"] == 1.0
    assert lm_metrics(1e6)["perplexity"] == math.inf
    assert math.isnan(lm_metrics(float("nan"))["perplexity"])


def test_json_safe_replaces_non_finite_and_numpy_scalars():
    out = json_safe({"a": float("nan"), "b": np.float32(1.5), "c": [np.int64(2), float("inf")], "d": True})
    assert out == {"a": None, "b": 1.5, "c": [2, None], "d": True}
    assert type(out["b"]) is float and type(out["c"][0]) is int


# ---------------------------------------------------------------- metrics log


def test_metrics_log_writes_flushed_strict_jsonl(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    log = MetricsLog(path, tensorboard_dir=None)
    log.log({"split": "train", "step": 1, "epoch": 0, "loss": np.float32(2.5), "lr": 1e-3})
    # flushed before close: a crash now would keep the row
    assert read_metrics(path) == [{"split": "train", "step": 1, "epoch": 0, "loss": 2.5, "lr": 1e-3}]
    log.log({"split": "val", "step": 1, "epoch": 0, "loss": float("nan"), "perplexity": float("inf")})
    log.close()

    lines = path.read_text().splitlines()
    assert len(lines) == 2
    rows = [_strict_loads(line) for line in lines]
    assert rows[1] == {"split": "val", "step": 1, "epoch": 0, "loss": None, "perplexity": None}
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_metrics_log_mirrors_scalars_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = tmp_path / "tensorboard"
    with MetricsLog(tmp_path / "metrics.jsonl", tb_dir) as log:
        for step in (10, 20):
            log.log({"split": "train", "step": step, "epoch": 0, "loss": 1.0 / step, "lr": 0.1})
        log.log({"split": "val", "step": 20, "epoch": 0, "loss": 0.5, "accuracy": 0.75, "grad": float("nan")})

    assert list(tb_dir.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(tb_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/epoch", "val/loss", "val/accuracy"} <= tags
    assert "val/grad" not in tags  # non-finite values are not sent
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("train/loss")] == [(10, 0.1), (20, 0.05)]
    assert [e.step for e in events.Scalars("val/accuracy")] == [20]


def test_read_metrics_ignores_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"split": "train", "step": 1}\n{"split": "train", "step": 2}\n{"split": "tra')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a crash mid-write is expected, not worth a warning
        rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 2]


def test_read_metrics_skips_damaged_middle_line_with_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"split": "train", "step": 1}\ngarbage\n{"split": "train", "step": 3}\n')
    with pytest.warns(UserWarning, match=":2:"):
        rows = read_metrics(path)
    assert [r["step"] for r in rows] == [1, 3]


def test_read_metrics_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="metrics.jsonl"):
        read_metrics(tmp_path / "metrics.jsonl")


def test_resumed_log_cuts_partial_line_and_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"split": "train", "step": 1}\n{"split": "train", "st')  # crashed mid-write
    with MetricsLog(path, None) as log:
        log.log({"split": "train", "step": 2})
    lines = path.read_text().splitlines()
    assert [_strict_loads(line)["step"] for line in lines] == [1, 2]


def test_auroc_balanced_accuracy_sensitivity_specificity_equal_scikit_learns():
    from sklearn.metrics import balanced_accuracy_score, confusion_matrix, roc_auc_score, roc_curve

    from trainforge.tasks.classification import binary_auroc, rate_metrics, roc_points

    rng = np.random.default_rng(7)
    for trial in range(30):
        k = 2 if trial % 2 else int(rng.integers(3, 6))
        n = int(rng.integers(20, 300))
        y = rng.integers(0, k, n)
        y[:k] = np.arange(k)  # every class present
        logits = rng.normal(size=(n, k)) + 1.5 * np.eye(k)[y] * (trial % 3)
        if trial % 5 == 0:
            logits = np.round(logits, 1)  # ties
        probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        pred = probs.argmax(1)
        cm = confusion_matrix(y, pred, labels=list(range(k)))
        got = rate_metrics(cm, probs, y)
        assert got["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(y, pred), abs=1e-12)
        if k == 2:
            assert got["auroc"] == pytest.approx(roc_auc_score(y, probs[:, 1]), abs=1e-12)
            tn, fp, fn, tp = cm.ravel()
            assert got["sensitivity"] == pytest.approx(tp / (tp + fn), abs=1e-12)
            assert got["specificity"] == pytest.approx(tn / (tn + fp), abs=1e-12)
            fpr, tpr, _ = roc_curve(y, probs[:, 1], drop_intermediate=False)
            curve = roc_points(probs[:, 1], y == 1)
            np.testing.assert_allclose(curve["fpr"], fpr, atol=1e-6)
            np.testing.assert_allclose(curve["tpr"], tpr, atol=1e-6)
        else:
            assert got["auroc"] == pytest.approx(roc_auc_score(y, probs, multi_class="ovr", average="macro"), abs=1e-12)
            assert got["sensitivity"] == pytest.approx(balanced_accuracy_score(y, pred), abs=1e-12)
    assert binary_auroc(np.array([0.1, 0.2]), np.array([True, True])) is None  # one side empty
