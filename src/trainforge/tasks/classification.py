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


def average_ranks(scores: np.ndarray) -> np.ndarray:
    """1-based ranks of `scores`, ties given their average rank (scipy's rankdata "average")."""
    order = np.argsort(scores, kind="mergesort")
    _, first, counts = np.unique(scores[order], return_index=True, return_counts=True)
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.repeat(first + (counts + 1) / 2, counts)
    return ranks


def binary_auroc(scores: np.ndarray, positive: np.ndarray) -> Optional[float]:
    """The area under the ROC curve of `scores` for the `positive` mask, as the Mann-Whitney U statistic (ties count
    half); None when one side is empty. Equal to scikit-learn's roc_auc_score (tests/training/test_metrics.py);
    written here because importing scikit-learn or torchmetrics costs each training process 1-4 s."""
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = average_ranks(np.asarray(scores, dtype=np.float64))
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def roc_points(scores: np.ndarray, positive: np.ndarray) -> Optional[dict[str, list[float]]]:
    """The ROC curve's corners (false and true positive rates at each distinct threshold, from (0, 0) to (1, 1));
    None when one side is empty."""
    positive = np.asarray(positive, dtype=bool)
    if positive.all() or not positive.any():
        return None
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="mergesort")
    s, p = np.asarray(scores, dtype=np.float64)[order], positive[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # the last sample of each threshold
    tp, fp = np.cumsum(p)[last], np.cumsum(~p)[last]
    return {"fpr": [0.0, *(fp / fp[-1]).round(6).tolist()], "tpr": [0.0, *(tp / tp[-1]).round(6).tolist()]}


def rate_metrics(cm: np.ndarray, probs: np.ndarray, y_true: np.ndarray) -> dict[str, Any]:
    """balanced_accuracy (mean recall of the classes present), sensitivity and specificity (of the positive class,
    the second one, for two classes; else the macro mean over the classes present) at the predicted class, and auroc
    (of the positive class's probability for two classes; else macro one-vs-rest over the classes present with
    samples of other classes too). None where undefined."""
    support = cm.sum(axis=1)
    present = np.flatnonzero(support > 0)
    if present.size == 0:
        return {"balanced_accuracy": None, "sensitivity": None, "specificity": None, "auroc": None}
    tp = np.diag(cm).astype(np.float64)
    fp = cm.sum(axis=0) - tp
    tn = cm.sum() - support - fp
    recall = np.divide(tp, support, out=np.zeros_like(tp), where=support > 0)
    negatives = tn + fp
    specificity = np.divide(tn, negatives, out=np.full_like(tp, np.nan), where=negatives > 0)
    k = cm.shape[0]
    if k == 2:
        aucs = [binary_auroc(probs[:, 1], y_true == 1)]
        sens = float(recall[1]) if support[1] > 0 else None
        spec = None if np.isnan(specificity[1]) else float(specificity[1])
    else:
        aucs = [binary_auroc(probs[:, c], y_true == c) for c in present]
        sens = float(recall[present].mean())
        spec_present = specificity[present][~np.isnan(specificity[present])]
        spec = float(spec_present.mean()) if spec_present.size else None
    aucs = [a for a in aucs if a is not None]
    return {"balanced_accuracy": float(recall[present].mean()), "sensitivity": sens, "specificity": spec,
            "auroc": float(np.mean(aucs)) if aucs else None}


@register_task
class Classification(Task):
    name = "classification"
    title = "classification"
    description = "one class per sample (images, tabular rows, text): accuracy, macro-F1, confusion matrix"
    metrics = ("loss", "accuracy", "macro_f1", "balanced_accuracy", "auroc", "sensitivity", "specificity")
    default_metric = "accuracy"
    higher_is_better = frozenset({"accuracy", "macro_f1", "balanced_accuracy", "auroc", "sensitivity", "specificity"})
    final_only = ("roc_curves",)
    predict_refusal = None
    token_augmentation = True
    quality = ("accuracy", "acc", "test accuracy")

    class_weighted = True

    def loss(self, output, target, *, label_smoothing=0.0, reduction="mean"):
        import torch.nn.functional as F  # loaded already where a loss is computed

        return F.cross_entropy(output, target, label_smoothing=label_smoothing, reduction=reduction)

    def class_logits(self, output):
        return output.reshape(-1, output.shape[-1])  # (N, classes)

    def training_loss(self, output, batch, *, label_smoothing=0.0, loss=None, class_weights=None):
        """Cross-entropy; with `class_weights` (train.class_weights) each sample weighs its class's weight and the
        mean is over the weights (torch's weighted cross-entropy)."""
        if class_weights is None:
            return super().training_loss(output, batch, label_smoothing=label_smoothing, loss=loss)
        import torch.nn.functional as F

        return F.cross_entropy(output.float(), self.target(batch), weight=class_weights,
                               label_smoothing=label_smoothing)

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


PICTURED_VOLUMES = 8  # validation volumes in the report's picture: each one's middle slice, framed right or wrong
SLICE_PX = 128
RIGHT, WRONG = (40, 170, 60), (220, 40, 40)


class ClassEvaluation(Evaluation):
    def __init__(self, task: Task, names: Sequence[str]) -> None:
        super().__init__(task)
        self.names = list(names)
        self.slices: list[tuple[Any, bool]] = []  # a volume's middle slice (its last axis), predicted right
        self.preds: list = []
        self.probs: list = []
        self.targets: list = []

    def add_batch(self, output, batch) -> None:
        super().add_batch(output, batch)
        x = self.task.inputs(batch)
        take = PICTURED_VOLUMES - len(self.slices)
        if take > 0 and getattr(x, "dim", lambda: 0)() == 5:  # volumes (N, C, D, H, W): the report shows slices
            right = (output[:take].argmax(-1) == self.task.target(batch)[:take]).tolist()
            for volume, ok in zip(x[:take], right):
                self.slices.append((volume[0, :, :, volume.shape[-1] // 2].detach().float().cpu(), bool(ok)))

    def picture(self) -> Optional[np.ndarray]:
        """Volumes only: the middle slice of each of the first validation volumes, framed green where the class was
        predicted right and red where wrong, in a row of up to four a line."""
        import torch.nn.functional as F

        if not self.slices:
            return None
        tiles = []
        for plane, ok in self.slices:
            lo, hi = float(plane.min()), float(plane.max())
            big = F.interpolate(((plane - lo) / max(hi - lo, 1e-6))[None, None], size=(SLICE_PX, SLICE_PX),
                                mode="bilinear")[0, 0]
            gray = np.uint8(255 * big.clamp(0, 1).numpy())
            tile = np.empty((SLICE_PX + 8, SLICE_PX + 8, 3), np.uint8)
            tile[:] = RIGHT if ok else WRONG
            tile[4:-4, 4:-4] = gray[..., None]
            tiles.append(tile)
        blank = np.full_like(tiles[0], 255)
        rows = [tiles[i:i + 4] + [blank] * (4 - len(tiles[i:i + 4])) for i in range(0, len(tiles), 4)]
        return np.concatenate([np.concatenate(r, axis=1) for r in rows], axis=0)

    def add(self, output, target) -> None:
        super().add(output, target)
        self.preds.append(output.argmax(-1).cpu())
        self.probs.append(output.detach().float().softmax(-1).cpu())
        self.targets.append(target.cpu())

    def result(self, detailed: bool) -> dict[str, Any]:
        import torch

        probs = torch.cat(self.probs).double().numpy()
        y_true = torch.cat(self.targets).numpy()
        m = classification_metrics(y_true, torch.cat(self.preds).numpy(), self.names)
        out: dict[str, Any] = {"accuracy": m["accuracy"], "macro_f1": m["macro_f1"]}
        if y_true.size:
            out.update(rate_metrics(np.asarray(m["confusion_matrix"]), probs, y_true))
        if detailed:
            out.update(per_class=m["per_class"], confusion_matrix=m["confusion_matrix"], class_names=self.names)
            if y_true.size:  # one curve per class (one-vs-rest; two classes: the positive one's)
                shown = [1] if len(self.names) == 2 else range(len(self.names))
                curves = {self.names[c]: roc_points(probs[:, c], y_true == c) for c in shown}
                out["roc_curves"] = {name: c for name, c in curves.items() if c is not None}
        return out
