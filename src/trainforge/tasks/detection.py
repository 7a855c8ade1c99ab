"""`detection`: the boxes and classes of the objects in an image (issue 28).

A sample is (image (C, H, W) float, {"boxes": (n, 4) float x1 y1 x2 y2 in pixels of that image, "labels": (n,) int64
in 1..num_classes-1}); class 0 is the background, as torchvision's detectors count (class_names[0] is
"__background__"). n may be 0: an image without objects (a negative). A batch is (images, targets): the images
stacked when they share a size (every source here resizes to data.args.image_size), else a list; targets a list of
dicts, one per image, as torchvision's detection models take them.

The model follows torchvision's detection convention, which a custom model keeps (docs/vision.md):
    training mode: model(images, targets) -> {loss name: scalar}, summed into the loss the loop backpropagates;
    eval mode:     model(images) -> [{"boxes": (k, 4), "scores": (k,), "labels": (k,)}] per image.

Evaluation is COCO's: torchmetrics' MeanAveragePrecision on the pycocotools backend (the reference implementation,
not a matcher of ours), whose numbers are reported under the stable names of METRICS. A detector gives no loss in
eval mode, so evaluation reports none.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from trainforge.tasks.base import Evaluation, Task, register_task

if TYPE_CHECKING:
    import torch

BACKGROUND = "__background__"
# eval.json's names (issue 28's contract: map, map_50, map_75), each torchmetrics' key of the same name
METRICS = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100")
# what the planner's example batch gives each image: boxes per image of a busy street scene (COCO's mean is ~7)
EXAMPLE_BOXES = 8


@register_task
class Detection(Task):
    name = "detection"
    title = "object detection"
    description = "boxes and classes of the objects in an image (COCO, YOLO or VOC data; torchvision detectors)"
    metrics = METRICS
    default_metric = "map"
    higher_is_better = frozenset(METRICS)
    quality = ("map_50", "mAP@.5", "test mAP at IoU 0.5")
    simulation_refusal = ("a detector picks its proposals and matches its boxes by their values (nonzero, nms), which "
                          "fake tensors cannot follow")
    export_refusal = ("compress does not export detectors yet: their outputs differ in size from image to image; "
                      "evaluate and serve the run's PyTorch model (trainforge eval) meanwhile")

    def collate(self, samples: list) -> tuple[Any, list[dict[str, "torch.Tensor"]]]:
        import torch

        images = [image for image, _ in samples]
        same = all(image.shape == images[0].shape for image in images)
        return (torch.stack(images) if same else images), [target for _, target in samples]

    def forward(self, model: Any, batch: Any) -> Any:
        images, targets = batch
        return model(images, targets) if model.training else model(images)

    def training_loss(self, output: dict[str, "torch.Tensor"], batch: Any, *, label_smoothing: float = 0.0):
        if not isinstance(output, dict) or not output:
            raise TypeError("a detection model in training mode returns its losses as a dict of scalars "
                            f"(torchvision's convention), got {type(output).__name__}")
        return sum(loss.float() for loss in output.values())

    def evaluation(self, info: Any) -> Evaluation:
        return DetectionEvaluation(self, tuple(info.class_names))

    def example_batch(self, info: Any, inputs: Any, batch_size: int) -> Any:
        """The images, and EXAMPLE_BOXES boxes of each class in turn per image: a detector's training step scales
        with the boxes it matches (its proposals are sampled to a fixed number, so the count matters little)."""
        import torch

        device = inputs.device
        h, w = inputs.shape[-2:]
        k = torch.arange(EXAMPLE_BOXES, dtype=torch.float32, device=device)
        x1, y1 = (k / EXAMPLE_BOXES) * (w / 2), (k / EXAMPLE_BOXES) * (h / 2)
        boxes = torch.stack([x1, y1, x1 + w / 4, y1 + h / 4], dim=1)
        labels = 1 + torch.arange(EXAMPLE_BOXES, device=device) % max(info.num_classes - 1, 1)
        return inputs, [{"boxes": boxes, "labels": labels} for _ in range(batch_size)]


class DetectionEvaluation(Evaluation):
    """COCO's metrics of one evaluation pass (torchmetrics' MeanAveragePrecision, pycocotools backend); per-class AP
    and AP@.5 in the detailed result (eval.json's `per_class`)."""

    def __init__(self, task: Task, class_names: tuple[str, ...]) -> None:
        super().__init__(task)
        self.class_names = class_names
        self.predictions: list[dict[str, "torch.Tensor"]] = []
        self.targets: list[dict[str, "torch.Tensor"]] = []

    def add_batch(self, output: list[dict[str, "torch.Tensor"]], batch: Any) -> None:
        for found, want in zip(output, batch[1]):
            self.count += 1
            self.predictions.append({k: found[k].detach().float().cpu() if k != "labels" else found[k].cpu()
                                     for k in ("boxes", "scores", "labels")})
            self.targets.append({"boxes": want["boxes"].float().cpu(), "labels": want["labels"].cpu()})

    @property
    def mean_loss(self) -> Optional[float]:
        return None  # in eval mode a detector gives its detections, not losses

    def result(self, detailed: bool) -> dict[str, Any]:
        return coco_metrics(self.predictions, self.targets, self.class_names, per_class=detailed)


def coco_metrics(predictions: list[dict[str, "torch.Tensor"]], targets: list[dict[str, "torch.Tensor"]],
                 class_names: tuple[str, ...], *, per_class: bool = False) -> dict[str, Any]:
    """COCO's box metrics of `predictions` against `targets` (one dict per image, xyxy pixels), by pycocotools through
    torchmetrics. -1 (COCO's "no such objects", e.g. map_small without small objects) is reported as None.
    `per_class`: {class name: {"ap", "ap_50"}} for each class present in the targets or the predictions."""
    import warnings

    from torchmetrics.detection import MeanAveragePrecision

    # sync_on_compute off: evaluation runs on rank 0 alone (every pass's detections are here); torchmetrics' default
    # would wait for the other ranks of an initialized process group to gather theirs, forever
    metric = MeanAveragePrecision(box_format="xyxy", iou_type="bbox", backend="pycocotools", class_metrics=per_class,
                                  sync_on_compute=False)
    with warnings.catch_warnings():  # "encountered more than 100 detections": COCO's max_dets, as intended
        warnings.simplefilter("ignore")
        metric.update(predictions, targets)
        values = metric.compute()
    out: dict[str, Any] = {name: _value(values[name]) for name in METRICS}
    if per_class:
        classes = values["classes"].reshape(-1).tolist()
        maps = values["map_per_class"].reshape(-1).tolist()
        out["per_class"] = {(class_names[c] if 0 <= c < len(class_names) else str(c)): {"ap": _value(ap)}
                            for c, ap in zip(classes, maps)}
    return out


def _value(tensor: Any) -> Optional[float]:
    v = float(tensor)
    return None if v < 0 else v
