"""Classification: one class per sample (images, tabular rows, text), cross-entropy over the classes, accuracy and
macro-F1, a confusion matrix in eval.json and the report."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from trainforge.errors import UserError
from trainforge.tasks.base import Evaluation, Task, mean_cross_entropy, register_task


def confusion_counts(y_true: np.ndarray, y_pred: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, num_classes) int64 counts: rows the true class, columns the predicted one."""
    flat = y_true.astype(np.int64) * num_classes + y_pred.astype(np.int64)
    return np.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def per_class_scores(cm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(precision, recall, f1, support) per class from a confusion matrix; an undefined ratio is 0.

    The same numbers as scikit-learn's `precision_recall_fscore_support(..., zero_division=0)`
    (tests/training/test_metrics.py compares them); computed here because importing scikit-learn costs
    every training process about 1.2 s at its first evaluation.
    """
    tp = np.diag(cm).astype(np.float64)
    predicted, support = cm.sum(axis=0), cm.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    both = (predicted + support).astype(np.float64)  # 2tp + fp + fn
    f1 = np.divide(2 * tp, both, out=np.zeros_like(tp), where=both > 0)
    return precision, recall, f1, support.astype(np.int64)


def classification_metrics(y_true: np.ndarray, y_pred: np.ndarray, class_names: Sequence[str]) -> dict:
    """Accuracy, macro-F1, per-class precision/recall/F1/support and the confusion matrix.

    `y_true` and `y_pred` are integer class indices into `class_names`. The confusion matrix has
    rows = true class, columns = predicted class, and covers every class even if it is absent.
    macro_f1 averages over the classes that occur in y_true or y_pred (scikit-learn's default), so
    a small split that happens to lack a class is not scored 0 for it; per_class lists all classes.
    Undefined ratios (no predictions or no samples of a class) are 0; an empty split gives NaN.
    """
    names = [str(n) for n in class_names]
    assert len(set(names)) == len(names), f"class names must be unique: {names}"
    y_true = np.asarray(y_true).reshape(-1)
    y_pred = np.asarray(y_pred).reshape(-1)
    assert y_true.shape == y_pred.shape, f"y_true {y_true.shape} and y_pred {y_pred.shape} differ"
    num_classes = len(names)
    for label, arr in (("label", y_true), ("prediction", y_pred)):
        if arr.size and (arr.min() < 0 or arr.max() >= num_classes):
            raise UserError(
                f"{label} {int(arr.min() if arr.min() < 0 else arr.max())} is outside 0..{num_classes - 1}; "
                f"the data's labels must index its {num_classes} class names"
            )

    if y_true.size == 0:
        cm = np.zeros((num_classes, num_classes), dtype=np.int64)
        precision = recall = f1 = np.zeros(num_classes)
        support = np.zeros(num_classes, dtype=np.int64)
        accuracy = macro_f1 = float("nan")
    else:
        cm = confusion_counts(y_true, y_pred, num_classes)
        precision, recall, f1, support = per_class_scores(cm)
        accuracy = float(np.mean(y_true == y_pred))
        present = np.union1d(np.unique(y_true), np.unique(y_pred))
        macro_f1 = float(np.mean(f1[present]))

    per_class = {
        name: {
            "precision": float(precision[i]),
            "recall": float(recall[i]),
            "f1": float(f1[i]),
            "support": int(support[i]),
        }
        for i, name in enumerate(names)
    }
    return {
        "accuracy": accuracy,
        "macro_f1": macro_f1,
        "per_class": per_class,
        "confusion_matrix": [[int(v) for v in row] for row in cm],
        "class_names": names,  # the report labels the confusion matrix with these
    }


@register_task
class Classification(Task):
    name = "classification"
    title = "classification"
    description = "one class per sample (images, tabular rows, text): accuracy, macro-F1, confusion matrix"
    metrics = ("loss", "accuracy", "macro_f1")
    default_metric = "accuracy"
    higher_is_better = frozenset({"accuracy", "macro_f1"})
    predict_refusal = None
    token_augmentation = True
    quality = ("accuracy", "acc", "test accuracy")

    def loss(self, output, target, *, label_smoothing=0.0, reduction="mean"):
        import torch.nn.functional as F  # loaded already where a loss is computed

        return F.cross_entropy(output, target, label_smoothing=label_smoothing, reduction=reduction)

    def evaluation(self, info: Any) -> Evaluation:
        names = list(info.class_names) or [str(i) for i in range(info.num_classes)]
        return ClassEvaluation(self, names)

    def example_target(self, info, batch_size):
        import torch

        return torch.zeros((batch_size,), dtype=torch.long)

    def tokens_per_sample(self, info: Any) -> int:
        if info.input_dtype == "int64" and len(info.input_shape) == 1:  # text: one token per position
            return int(info.seq_len or info.input_shape[-1])
        return 1

    def output_shape(self, input_shape: tuple[int, ...], num_classes: int) -> tuple[int, ...]:
        return (-1, num_classes)

    def score_logits(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, Optional[float]]:
        loss, flat = mean_cross_entropy(logits, labels)
        return {"accuracy": float((flat.argmax(axis=1) == labels.reshape(-1)).mean()), "loss": loss}

    prediction_columns = ("label", "probability")

    def predictions(self, outputs: dict[str, np.ndarray], meta: dict[str, Any], *, top_k: int) -> list[dict[str, Any]]:
        """{"label", "index", "probability", "top": [[label, probability], ...]} (the `top_k` most likely, best first)."""
        (logits,) = outputs.values()
        if logits.ndim != 2:
            raise UserError(f"ARTIFACT: returned logits of shape {logits.shape}; a classifier returns (batch, classes)")
        probs = softmax(logits)
        names = [str(c) for c in meta.get("class_names") or []]
        if names and probs.shape[1] != len(names):
            raise UserError(f"ARTIFACT: returns {probs.shape[1]} classes but names {len(names)}; re-export it")
        labels = names or [str(i) for i in range(probs.shape[1])]
        rows = []
        for p in probs:
            top = rank(p, top_k)
            rows.append({"label": labels[top[0]], "index": top[0], "probability": float(p[top[0]]),
                         "top": [[labels[i], float(p[i])] for i in top]})
        return rows


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64 (shifted by the row maximum, so large logits do not overflow)."""
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def rank(probs: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest probabilities, largest first; ties go to the lower index (like argmax)."""
    return [int(i) for i in np.argsort(-probs, kind="stable")[:k]]


class ClassEvaluation(Evaluation):
    def __init__(self, task: Task, names: Sequence[str]) -> None:
        super().__init__(task)
        self.names = list(names)
        self.preds: list = []
        self.targets: list = []

    def add(self, output, target) -> None:
        super().add(output, target)
        self.preds.append(output.argmax(-1).cpu())
        self.targets.append(target.cpu())

    def result(self, detailed: bool) -> dict[str, Any]:
        import torch

        m = classification_metrics(torch.cat(self.targets).numpy(), torch.cat(self.preds).numpy(), self.names)
        out: dict[str, Any] = {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"]}
        if detailed:
            out.update(per_class=m["per_class"], confusion_matrix=m["confusion_matrix"], class_names=self.names)
        return out
