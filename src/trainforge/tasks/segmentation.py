"""`segmentation`: a class for every pixel of an image (semantic segmentation, issue 28).

A sample is (image (C, H, W) float, mask (H, W) int64 of class indices, IGNORE where a pixel is not labelled: VOC's
void border, or what an augmentation moved into view); a batch stacks both. The model returns logits (N, classes,
H, W) at the mask's size (torchvision's segmenters as `model.name: segmenter` do; a custom model the same). The loss
is cross-entropy over the labelled pixels; evaluation accumulates the confusion matrix of every labelled pixel, from
which come mIoU (the mean IoU of the classes present in the labels or the predictions), Dice (likewise), pixel
accuracy, and per class IoU and Dice (eval.json's `per_class`).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from trainforge.geometry import Fit, mask_to_file
from trainforge.errors import UserError
from trainforge.tasks.base import Evaluation, Task, register_task

IGNORE = 255  # a mask value that is no class: left out of the loss and the metrics (VOC's "void")
METRICS = ("loss", "miou", "dice", "pixel_accuracy")
PICTURED = 4  # validation images in the report's picture: a row each (image, true mask, predicted mask)
TILE_PX = 192


@register_task
class Segmentation(Task):
    name = "segmentation"
    title = "semantic segmentation"
    description = "a class for every pixel (image + mask PNG folders; torchvision's DeepLabV3, FCN, LRASPP): mIoU, Dice"
    metrics = METRICS
    default_metric = "miou"
    higher_is_better = frozenset(("miou", "dice", "pixel_accuracy"))
    quality = ("miou", "mIoU", "test mIoU")
    prediction_columns = ("classes",)
    chart_metrics = ("miou", "dice", "pixel_accuracy")
    # train.loss: cross-entropy (torch), or MONAI's soft Dice, Dice + cross-entropy, focal; every one leaves the
    # unlabelled pixels (IGNORE) out. Validation's loss stays cross-entropy, whatever the run trains with
    losses = ("cross_entropy", "dice", "dice_ce", "focal")

    def loss(self, output, target, *, label_smoothing=0.0, reduction="mean"):
        import torch.nn.functional as F

        return F.cross_entropy(output, target, ignore_index=IGNORE, label_smoothing=label_smoothing,
                               reduction=reduction)

    def training_loss(self, output: Any, batch: Any, *, label_smoothing: float = 0.0, loss: Optional[str] = None):
        """Cross-entropy by default; `loss` (train.loss) one of `losses`: Dice over the whole batch (MONAI's
        DiceLoss, softmax, every class including the background), Dice + cross-entropy (their sum), or focal
        (MONAI's FocalLoss, softmax, gamma 2)."""
        output, target = output.float(), self.target(batch)
        if loss in (None, "cross_entropy"):
            return self.loss(output, target, label_smoothing=label_smoothing)
        named = named_loss(loss)
        value = named(output, target[:, None])
        if loss == "dice_ce":
            value = value + self.loss(output, target, label_smoothing=label_smoothing)
        return value

    def class_logits(self, output):
        return output.movedim(1, -1).reshape(-1, output.shape[1])  # (N, C, *spatial) -> a row a pixel (voxel)

    def evaluation(self, info: Any) -> Evaluation:
        return SegmentationEvaluation(self, tuple(info.class_names) or tuple(map(str, range(info.num_classes))))

    def example_target(self, info: Any, batch_size: int):
        import torch

        return torch.zeros((batch_size, *info.input_shape[1:]), dtype=torch.long)  # (H, W), or a volume's (D, H, W)

    def output_shape(self, input_shape: tuple[int, ...], num_classes: int) -> tuple[int, ...]:
        return (-1, num_classes, *input_shape[1:])

    def export_example(self, feeds: dict[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
        """A volume segmenter trained on patches (data.args.patch) is exported at the patch's size (the centre of
        each example volume); `serve` slides it over whole volumes."""
        patch = tuple(info.input_shape[1:])
        out = {}
        for name, x in feeds.items():
            starts = [(s - p) // 2 for s, p in zip(x.shape[2:], patch)]
            fits = len(patch) == x.ndim - 2 and all(s >= 0 for s in starts)
            out[name] = x[(slice(None), slice(None), *(slice(s, s + p) for s, p in zip(starts, patch)))] if fits else x
        return out

    def serve(self, run: Any, feeds: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, np.ndarray]:
        """A volume larger than the patch the graph takes (data.args.patch): MONAI's sliding_window_inference over
        it, each window one call of the graph (as the PyTorch model evaluates it); else one call."""
        patch = (meta.get("preprocess") or {}).get("patch")
        (name, x), = feeds.items()
        if not patch or list(x.shape[2:]) == list(patch):
            return run(feeds)
        import torch
        from monai.inferers import sliding_window_inference

        names: list[str] = []

        def window(t: "torch.Tensor") -> "torch.Tensor":
            out = run({name: np.ascontiguousarray(t.numpy())})
            names[:] = list(out)
            return torch.from_numpy(next(iter(out.values())))

        with torch.no_grad():
            slid = sliding_window_inference(torch.from_numpy(x), tuple(patch), 1, window, overlap=0.25, mode="gaussian")
        return {names[0]: slid.numpy()}

    def score_logits(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, Optional[float]]:
        """mIoU, pixel accuracy (`accuracy`, what compress's recommendation compares) and the loss, in numpy."""
        cm = confusion(labels, logits.argmax(axis=1), logits.shape[1])
        scores = scores_of(cm)
        labelled = labels != IGNORE
        flat = np.moveaxis(logits, 1, -1)[labelled].astype(np.float64)
        shifted = flat - flat.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = float(-log_probs[np.arange(len(flat)), labels[labelled]].mean()) if len(flat) else None
        return {"miou": scores["miou"], "accuracy": scores["pixel_accuracy"], "loss": loss}

    def predictions(self, outputs: dict[str, np.ndarray], meta: dict[str, Any], *, top_k: int) -> list[dict[str, Any]]:
        """Per image: the share of its pixels predicted as each class present, largest first, and its height and
        width: the image file's, the mask resized back to it (nearest neighbour) where predict read a file
        (`meta["fits"]`); the mask itself is a PNG: `predict --images DIR`."""
        (logits,) = outputs.values()
        if logits.ndim not in (4, 5):
            raise UserError(f"ARTIFACT: returned logits of shape {logits.shape}; a segmenter returns (batch, classes, "
                            "height, width), or (batch, classes, depth, height, width) for volumes")
        names = [str(c) for c in meta.get("class_names") or range(logits.shape[1])]
        rows = []
        fits = meta.get("fits") or []
        for i, mask in enumerate(logits.argmax(axis=1)):
            if i < len(fits) and fits[i] and mask.ndim == 2:
                mask = mask_to_file(mask, Fit.from_json(fits[i]))
            counts = np.bincount(mask.reshape(-1), minlength=len(names))
            order = [int(i) for i in np.argsort(-counts, kind="stable") if counts[i]]
            row: dict[str, Any] = {"classes": {names[i]: round(float(counts[i] / mask.size), 4) for i in order[:top_k]}}
            if mask.ndim == 3:  # a volume: its voxels' shape
                row["shape"] = [int(v) for v in mask.shape]
            else:
                row.update(height=int(mask.shape[0]), width=int(mask.shape[1]))
            rows.append(row)
        return rows

    def prediction_image(self, sample: dict, output: dict, prediction: dict, meta: dict) -> Optional[np.ndarray]:
        """The image with each pixel tinted by its predicted class (class 0 left as it is), beside the mask."""
        (logits,) = output.values()
        (image,) = sample.values()
        if len(meta.get("input_shape") or ()) == 4:  # a volume's (classes, D, H, W): the middle slice, last axis
            mask = logits.argmax(axis=0)
            mask, image = mask[..., mask.shape[-1] // 2], image[..., image.shape[-1] // 2]
        else:
            mask = logits[0].argmax(axis=0) if logits.ndim == 4 else logits.argmax(axis=0)
            image = image[0] if image.ndim == 4 else image
            if meta.get("fit"):  # at the file's size: the image's part of the input, resized back
                fit = Fit.from_json(meta["fit"])
                mask, image = mask_to_file(mask, fit), image_to_file(image, fit)
        rgb = image[:3] if image.shape[0] >= 3 else np.repeat(image[:1], 3, axis=0)
        rgb = (rgb - rgb.min()) / max(float(np.ptp(rgb)), 1e-6)
        colours = palette(int(logits.shape[-3]))
        tinted = np.where(mask[..., None] > 0, 0.5 * rgb.transpose(1, 2, 0) + 0.5 * colours[mask] / 255,
                          rgb.transpose(1, 2, 0))
        return np.concatenate([np.uint8(255 * tinted), colours[mask]], axis=1)


def image_to_file(image: np.ndarray, fit: Fit) -> np.ndarray:
    """(C, H, W) of the model's input -> (C, file height, file width): the image's part, resized bilinearly."""
    from PIL import Image

    part = image[:, fit.top:fit.top + fit.height, fit.left:fit.left + fit.width].astype(np.float32)
    return np.stack([np.asarray(Image.fromarray(c).resize((fit.file_width, fit.file_height),
                                                          Image.Resampling.BILINEAR)) for c in part])


def named_loss(name: str) -> Any:
    """MONAI's loss module of `name` (dice, dice_ce: its Dice part; focal), the unlabelled pixels ignored."""
    from monai.losses import DiceLoss, FocalLoss  # heavy: only a run that names one of them loads MONAI

    if name in ("dice", "dice_ce"):
        return DiceLoss(include_background=True, to_onehot_y=True, softmax=True, batch=True, ignore_index=IGNORE)
    if name == "focal":
        return FocalLoss(include_background=True, to_onehot_y=True, use_softmax=True, gamma=2.0, ignore_index=IGNORE)
    raise ValueError(f"unknown segmentation loss {name!r}")


def hd95_voxels(predicted: Any, target: Any, classes: int) -> list[float]:
    """MONAI's 95th-percentile Hausdorff distance (voxels) between the predicted and true region of each foreground
    class of each volume, where both are non-empty (elsewhere it is undefined); unlabelled voxels count as
    background."""
    import warnings

    import torch
    import torch.nn.functional as F
    from monai.metrics import compute_hausdorff_distance

    target = torch.where(target == IGNORE, 0, target)
    onehot = [F.one_hot(v.long(), classes).movedim(-1, 1) for v in (predicted, target)]
    with warnings.catch_warnings():  # an empty class warns; its distance is left out below
        warnings.simplefilter("ignore")
        distances = compute_hausdorff_distance(*onehot, include_background=False, percentile=95)
    values = distances.reshape(-1).double()
    return [float(v) for v in values[torch.isfinite(values)]]


def palette(classes: int) -> np.ndarray:
    """(classes, 3) uint8 colours, VOC's bit-interleaved palette (class 0 black)."""
    out = np.zeros((classes, 3), dtype=np.uint8)
    for c in range(classes):
        v, r, g, b = c, 0, 0, 0
        for shift in range(8):
            r |= ((v >> 0) & 1) << (7 - shift)
            g |= ((v >> 1) & 1) << (7 - shift)
            b |= ((v >> 2) & 1) << (7 - shift)
            v >>= 3
        out[c] = (r, g, b)
    return out


def confusion(labels: np.ndarray, predicted: np.ndarray, classes: int) -> np.ndarray:
    """(classes, classes) int64 counts of the labelled pixels: rows the true class, columns the predicted one."""
    labels, predicted = labels.reshape(-1), predicted.reshape(-1)
    keep = labels != IGNORE
    return np.bincount(classes * labels[keep].astype(np.int64) + predicted[keep],
                       minlength=classes * classes).reshape(classes, classes)


def scores_of(cm: np.ndarray) -> dict[str, Any]:
    """mIoU, Dice, pixel accuracy, and per class IoU and Dice (None for a class in neither labels nor predictions;
    the means are over the classes that are)."""
    cm = cm.astype(np.float64)
    tp = np.diag(cm)
    union = cm.sum(axis=0) + cm.sum(axis=1) - tp
    present = union > 0
    iou = np.divide(tp, union, out=np.zeros_like(tp), where=present)
    dice = np.divide(2 * tp, union + tp, out=np.zeros_like(tp), where=present)
    total = cm.sum()
    return {"miou": float(iou[present].mean()) if present.any() else None,
            "dice": float(dice[present].mean()) if present.any() else None,
            "pixel_accuracy": float(tp.sum() / total) if total else None,
            "iou": [float(v) if p else None for v, p in zip(iou, present)],
            "dice_per_class": [float(v) if p else None for v, p in zip(dice, present)]}


class SegmentationEvaluation(Evaluation):
    def __init__(self, task: Task, names: tuple[str, ...]) -> None:
        super().__init__(task)
        self.names = names
        self.cm = np.zeros((len(names), len(names)), dtype=np.int64)
        self.kept: list[tuple[Any, Any, Any]] = []  # (image, true mask, predicted mask) of the first PICTURED
        self.hd95: list[float] = []  # volumes: each sample's and foreground class's HD95 where both are non-empty

    def add_batch(self, output, batch) -> None:
        for image, mask, logits in list(zip(batch[0], batch[1], output))[:max(PICTURED - len(self.kept), 0)]:
            self.kept.append((image.detach().float().cpu(), mask.cpu(), logits.detach().argmax(0).cpu()))
        super().add_batch(output, batch)

    def add(self, output, target) -> None:
        self.loss_sum += float(self.task.loss(output, target, reduction="sum"))
        labelled = int((target != IGNORE).sum())
        self.count += labelled
        predicted = output.argmax(1)
        self.cm += confusion(target.cpu().numpy(), predicted.cpu().numpy(), len(self.names))
        if target.dim() == 4:  # volumes (N, D, H, W): the 95th-percentile Hausdorff distance of each foreground class
            self.hd95.extend(hd95_voxels(predicted.cpu(), target.cpu(), len(self.names)))

    @property
    def mean_loss(self) -> Optional[float]:
        return self.loss_sum / self.count if self.count else None

    def picture(self) -> Optional[np.ndarray]:
        """A row per image: the image, the true mask, the predicted mask (VOC's palette; unlabelled pixels white)."""
        import torch
        import torch.nn.functional as F

        colours = np.concatenate([palette(len(self.names)), np.zeros((256 - len(self.names), 3), np.uint8)])
        colours[IGNORE] = 255
        rows = []
        for image, mask, predicted in self.kept:
            if mask.dim() == 3:  # a volume: the middle slice along its last axis, of the image and both masks
                image, mask, predicted = (t[..., t.shape[-1] // 2] for t in (image, mask, predicted))
            scale = TILE_PX / max(image.shape[-2:])
            size = [round(image.shape[-2] * scale), round(image.shape[-1] * scale)]
            rgb = image[:3] if image.shape[0] >= 3 else image[:1].expand(3, -1, -1)
            lo, hi = float(rgb.min()), float(rgb.max())
            rgb = F.interpolate(((rgb - lo) / max(hi - lo, 1e-6))[None], size=size, mode="bilinear")[0]
            tiles = [np.uint8(255 * rgb.clamp(0, 1).permute(1, 2, 0).numpy())]
            for m in (mask, predicted):
                big = F.interpolate(m[None, None].float(), size=size, mode="nearest")[0, 0].long()
                tiles.append(colours[big.clamp(0, 255).numpy()])
            gap = np.full((size[0], 4, 3), 255, np.uint8)
            rows.append(np.concatenate([tiles[0], gap, tiles[1], gap, tiles[2]], axis=1))
        if not rows or any(r.shape != rows[0].shape for r in rows):
            return None
        gap = np.full((4, rows[0].shape[1], 3), 255, np.uint8)
        return np.concatenate([part for r in rows for part in (r, gap)][:-1], axis=0)

    def result(self, detailed: bool) -> dict[str, Any]:
        scores = scores_of(self.cm)
        out: dict[str, Any] = {k: scores[k] for k in ("miou", "dice", "pixel_accuracy")}
        if detailed and self.hd95:
            out["hd95_voxels"] = float(np.mean(self.hd95))
        if detailed:
            out["per_class"] = {name: {"iou": iou, "dice": dice}
                                for name, iou, dice in zip(self.names, scores["iou"], scores["dice_per_class"])}
        return out
