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

from collections import Counter
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from trainforge.geometry import Fit, to_file
from trainforge.tasks.base import INPUT_NAME, Evaluation, ExportSignature, Feeds, Runner, Task, register_task

if TYPE_CHECKING:
    import torch

BACKGROUND = "__background__"
# eval.json's names (issue 28's contract: map, map_50, map_75), each torchmetrics' key of the same name
METRICS = ("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10", "mar_100")
# what the planner's example batch gives each image: boxes per image of a busy street scene (COCO's mean is ~7)
EXAMPLE_BOXES = 8
# the exported model's outputs (issue 28 Build 6): per image, its detections padded to SERVED_DETECTIONS rows, best
# first; a padding row has label -1, score 0 and box 0. SERVED_DETECTIONS is COCO's maxDets, torchvision's
# detections_per_img default: mAP counts no more (a model that keeps more is served its best 100)
OUTPUTS = ("boxes", "scores", "labels")
SERVED_DETECTIONS = 100
PADDING_LABEL = -1
SHOWN_SCORE = 0.5  # predict's `objects` counts and drawn boxes: the detections scoring at least this
PICTURED = 8  # validation images in the report's grid (4 a row), each drawn at TILE_PX on its longer side
TILE_PX = 256


@register_task
class Detection(Task):
    name = "detection"
    title = "object detection"
    description = "boxes and classes of the objects in an image (COCO, YOLO or VOC data; torchvision detectors)"
    metrics = METRICS
    default_metric = "map"
    higher_is_better = frozenset(METRICS)
    quality = ("map_50", "mAP@.5", "test mAP at IoU 0.5")
    served_batch = 1  # `serve` calls the graph once per image: batch 1's latency is what a user gets
    simulation_refusal = ("a detector picks its proposals and matches its boxes by their values (nonzero, nms), which "
                          "fake tensors cannot follow")
    chart_metrics = ("map", "map_50", "map_75", "mar_100")
    final_only = ("pr_curves",)  # 101 precisions a class
    export_batch_size = 1  # the graph takes one image; serve calls it once per image
    prediction_columns = ("objects",)

    distill_refusal = ("detection defines no distillation: a detector's outputs are boxes, scores and a loss dict, not "
                       "rows of class logits; drop --distill (the pruned model is fine-tuned with the detector's own "
                       "losses)")

    def collate(self, samples: list) -> tuple[Any, list[dict[str, "torch.Tensor"]]]:
        import torch

        images = [image for image, _ in samples]
        same = all(image.shape == images[0].shape for image in images)
        return (torch.stack(images) if same else images), [target for _, target in samples]

    def forward(self, model: Any, batch: Any) -> Any:
        images, targets = batch
        return model(images, targets) if model.training else model(images)

    def training_loss(self, output: dict[str, "torch.Tensor"], batch: Any, *, label_smoothing: float = 0.0,
                      loss: Optional[str] = None):
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


    # ---- export and serving
    def export_signature(self, info: Any) -> ExportSignature:
        """One image in (1, C, H, W), H and W dynamic (data.args.resize keep_aspect gives each image its own aspect),
        its detections out: boxes (n, 4) xyxy in the input's pixels, scores (n,), labels (n,), n dynamic."""
        return ExportSignature((INPUT_NAME,), OUTPUTS, {INPUT_NAME: {2: "height", 3: "width"},
                                                        **{name: {0: "detections"} for name in OUTPUTS}})

    def export_module(self, model: Any, info: Any) -> Any:
        from trainforge.tasks.exporting import OneImageDetections

        return OneImageDetections(model)

    def export_feeds(self, batch: Any, info: Any) -> Feeds:
        import torch

        images = batch[0]
        if not isinstance(images, list):
            return {INPUT_NAME: images.detach().cpu().numpy()}
        if all(image.shape == images[0].shape for image in images):
            return {INPUT_NAME: torch.stack(images).detach().cpu().numpy()}
        ragged = np.empty(len(images), dtype=object)  # images of their own sizes: `serve` feeds them one by one
        for i, image in enumerate(images):
            ragged[i] = image.detach().cpu().numpy()
        return {INPUT_NAME: ragged}

    def serve(self, run: Runner, feeds: Feeds, meta: dict[str, Any]) -> dict[str, np.ndarray]:
        """The graph on each image in turn, its detections padded: boxes (B, 100, 4), scores (B, 100), labels (B, 100),
        best first, padding rows labelled -1."""
        ((name, images),) = feeds.items()
        return pad_detections([run({name: np.asarray(images[i])[None] if images.dtype == object else images[i:i + 1]})
                               for i in range(len(images))])

    def score_outputs(self, outputs: dict[str, np.ndarray], batch: Any, info: Any) -> dict[str, Optional[float]]:
        """Compress's quality columns: COCO's mAP of the served detections on the test split."""
        import torch

        found = [{"boxes": torch.from_numpy(d["boxes"]).float(), "scores": torch.from_numpy(d["scores"]).float(),
                  "labels": torch.from_numpy(d["labels"]).long()} for d in unpadded(outputs)]
        scores = coco_metrics(found, batch[1], tuple(info.class_names))
        return {name: scores[name] for name in ("map", "map_50", "map_75")}

    def predictions(self, outputs: dict[str, np.ndarray], meta: dict[str, Any], *, top_k: int) -> list[dict[str, Any]]:
        """Per image: `detections` (every box the model kept, best first: label, score, box [x1, y1, x2, y2] in the
        pixels of the image file it was read from (`meta["fits"]`, one per image: where predict's reader placed the
        file in the model's input; the model input's pixels for arrays), and `box_relative` as fractions of that
        image's width and height), `width` and `height` (the file's), and `objects` (how many of each class score at
        least SHOWN_SCORE). `top_k` does not apply: an image has as many objects as it has."""
        names = [str(c) for c in meta.get("class_names") or []]
        fits = meta.get("fits") or []
        rows = []
        for i, image in enumerate(unpadded(outputs)):
            fit = Fit.from_json(fits[i]) if i < len(fits) and fits[i] else None
            boxes = image["boxes"]
            if fit is not None:
                width, height = fit.file_width, fit.file_height
                boxes = to_file(boxes, fit)
            else:
                _, height, width = (list(meta.get("input_shape") or [0, 0, 0]) + [0, 0, 0])[:3]
            detections = []
            for box, score, label in zip(boxes.tolist(), image["scores"].tolist(), image["labels"].tolist()):
                detections.append({"label": names[label] if 0 <= label < len(names) else str(label),
                                   "score": round(float(score), 4), "box": [round(v, 2) for v in box],
                                   "box_relative": [round(box[0] / width, 5), round(box[1] / height, 5),
                                                    round(box[2] / width, 5), round(box[3] / height, 5)]
                                   if width and height else None})
            objects = Counter(d["label"] for d in detections if d["score"] >= SHOWN_SCORE)
            rows.append({"objects": dict(objects.most_common()), "detections": detections,
                         "width": int(width), "height": int(height)})
        return rows

    def prediction_image(self, sample: Feeds, output: dict[str, np.ndarray], prediction: dict[str, Any],
                         meta: dict[str, Any]) -> Optional[np.ndarray]:
        """The image with the boxes scoring at least SHOWN_SCORE drawn, each in its class's colour, labelled."""
        from PIL import Image, ImageDraw

        from trainforge.tasks.segmentation import palette

        (image,) = sample.values()
        image = image[0] if image.ndim == 4 else image
        rgb = image[:3] if image.shape[0] >= 3 else np.repeat(image[:1], 3, axis=0)
        rgb = (rgb - rgb.min()) / max(float(np.ptp(rgb)), 1e-6)
        picture = Image.fromarray(np.uint8(255 * rgb.transpose(1, 2, 0)))
        if meta.get("fit"):  # back to the file's size: the boxes are in its pixels
            picture = picture_of_file(picture, Fit.from_json(meta["fit"]))
        draw = ImageDraw.Draw(picture)
        names = [str(c) for c in meta.get("class_names") or []]
        colours = palette(max(len(names), 2) + 1)
        for d in prediction["detections"]:
            if d["score"] < SHOWN_SCORE:
                continue
            index = names.index(d["label"]) if d["label"] in names else 1
            colour = tuple(int(c) for c in colours[index])
            draw.rectangle(d["box"], outline=colour, width=2)
            draw.text((d["box"][0] + 2, d["box"][1] + 1), f"{d['label']} {d['score']:.2f}", fill=colour)
        return np.asarray(picture, dtype=np.uint8)


def picture_of_file(picture: Any, fit: Fit) -> Any:
    """The model input's picture (a PIL image) cropped to where the file's image lies and resized to the file's size."""
    from PIL import Image

    part = picture.crop((fit.left, fit.top, fit.left + fit.width, fit.top + fit.height))
    return part.resize((fit.file_width, fit.file_height), Image.Resampling.BILINEAR)


def pad_detections(images: list[dict[str, np.ndarray]], rows: int = SERVED_DETECTIONS,
                   box_values: int = 4) -> dict[str, np.ndarray]:
    """Each image's detections (the graph's outputs of one image), best `rows` first, as (B, rows, ...) arrays
    padded with label -1, score 0, box 0 (`box_values` numbers a box: 4 corners in 2D, 7 for a 3D box)."""
    boxes = np.zeros((len(images), rows, box_values), dtype=np.float32)
    scores = np.zeros((len(images), rows), dtype=np.float32)
    labels = np.full((len(images), rows), PADDING_LABEL, dtype=np.int64)
    for i, found in enumerate(images):
        order = np.argsort(-found["scores"], kind="stable")[:rows]
        n = len(order)
        boxes[i, :n], scores[i, :n], labels[i, :n] = found["boxes"][order], found["scores"][order], found["labels"][order]
    return {"boxes": boxes, "scores": scores, "labels": labels}


def unpadded(outputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The served (padded) outputs of a batch back to each image's own detections."""
    out = []
    for boxes, scores, labels in zip(outputs["boxes"], outputs["scores"], outputs["labels"]):
        keep = labels != PADDING_LABEL
        out.append({"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]})
    return out


class DetectionEvaluation(Evaluation):
    """COCO's metrics of one evaluation pass (torchmetrics' MeanAveragePrecision, pycocotools backend); per-class AP
    and AP@.5 in the detailed result (eval.json's `per_class`)."""

    def __init__(self, task: Task, class_names: tuple[str, ...]) -> None:
        super().__init__(task)
        self.class_names = class_names
        self.predictions: list[dict[str, "torch.Tensor"]] = []
        self.targets: list[dict[str, "torch.Tensor"]] = []
        self.images: list["torch.Tensor"] = []  # the first PICTURED images, for `picture`

    def add_batch(self, output: list[dict[str, "torch.Tensor"]], batch: Any) -> None:
        for image in list(batch[0])[:max(PICTURED - len(self.images), 0)]:
            self.images.append(image.detach().float().cpu())
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

    def picture(self) -> Optional[np.ndarray]:
        """The first images, true boxes in green, predicted ones (scoring at least SHOWN_SCORE) in red with class
        and score, 4 a row."""
        import torch
        import torch.nn.functional as F
        from torchvision.utils import draw_bounding_boxes, make_grid

        tiles = []
        for image, found, want in zip(self.images, self.predictions, self.targets):
            scale = TILE_PX / max(image.shape[-2:])
            size = [round(image.shape[-2] * scale), round(image.shape[-1] * scale)]
            rgb = image[:3] if image.shape[0] >= 3 else image[:1].expand(3, -1, -1)
            lo, hi = float(rgb.min()), float(rgb.max())
            rgb = F.interpolate(((rgb - lo) / max(hi - lo, 1e-6))[None], size=size, mode="bilinear")[0]
            tile = (rgb.clamp(0, 1) * 255).to(torch.uint8)
            if len(want["boxes"]):  # an image without objects (a negative) has none to draw
                tile = draw_bounding_boxes(tile, want["boxes"] * scale, colors="lime", width=2)
            shown = found["scores"] >= SHOWN_SCORE
            names = [self.class_names[c] if 0 <= c < len(self.class_names) else str(c)
                     for c in found["labels"][shown].tolist()]
            labels = [f"{n} {s:.2f}" for n, s in zip(names, found["scores"][shown].tolist())]
            if labels:
                tile = draw_bounding_boxes(tile, found["boxes"][shown] * scale, labels=labels, colors="red", width=2)
            tiles.append(tile)
        if not tiles or any(t.shape != tiles[0].shape for t in tiles):
            return None
        return make_grid(tiles, nrow=4, padding=4, pad_value=255).permute(1, 2, 0).numpy()


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
                                  extended_summary=per_class, sync_on_compute=False)
    with warnings.catch_warnings():  # "encountered more than 100 detections": COCO's max_dets, as intended
        warnings.simplefilter("ignore")
        metric.update(predictions, targets)
        values = metric.compute()
    out: dict[str, Any] = {name: _value(values[name]) for name in METRICS}
    if per_class:
        classes = values["classes"].reshape(-1).tolist()
        maps = values["map_per_class"].reshape(-1).tolist()
        names = [class_names[c] if 0 <= c < len(class_names) else str(c) for c in classes]
        out["per_class"] = {name: {"ap": _value(ap)} for name, ap in zip(names, maps)}
        out["pr_curves"] = pr_curves(values["precision"], names)
    return out


# the recall levels COCO interpolates precision at (COCOeval's recThrs: 0, 0.01, ..., 1)
RECALL_LEVELS = tuple(round(i / 100, 2) for i in range(101))


def pr_curves(precision: Any, names: list[str]) -> dict[str, Any]:
    """Per class, COCO's interpolated precision at each of RECALL_LEVELS, at IoU 0.5, over objects of every size and
    up to 100 detections an image (COCOeval's precision array [T, R, K, A, M] at T=0.5, A=all, M=100); None where the
    class has no such recall (COCO's -1). eval.json's `pr_curves`, the report's precision-recall chart."""
    at_50 = precision[0, :, :, 0, -1]  # (recall levels, classes)
    curves = {name: [None if v < 0 else round(float(v), 4) for v in at_50[:, k].tolist()]
              for k, name in enumerate(names) if k < at_50.shape[1]}
    return {"iou": 0.5, "recall": list(RECALL_LEVELS), "precision": curves}


def _value(tensor: Any) -> Optional[float]:
    v = float(tensor)
    return None if v < 0 else v
