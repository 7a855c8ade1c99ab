"""What a task is: the interface every task implements, and the registry the core looks tasks up in."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from trainforge.errors import UserError
from trainforge.registry import Registry

if TYPE_CHECKING:  # torch is imported by the methods that need it
    import torch

MAX = "max"
MIN = "min"
INPUT_NAME = "input"  # the ONNX input of a model of one input
OUTPUT_NAME = "logits"  # the ONNX output of a task of one output
BATCH_AXIS = "batch"

Feeds = dict  # {ONNX input name: numpy array}: what onnxruntime runs on
Runner = Callable[[Feeds], "dict[str, np.ndarray]"]  # one inference: feeds in, {output name: array} out


@dataclass(frozen=True)
class ExportSignature:
    """What an exported model takes and returns: ONNX input and output names (in the graph's order) and, for each,
    its dynamic axes ({axis: label}; every task's axis 0 is the batch)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)

    @classmethod
    def batched(cls, inputs: Sequence[str], outputs: Sequence[str]) -> "ExportSignature":
        """Every input and output dynamic along the batch (axis 0) only."""
        return cls(tuple(inputs), tuple(outputs), {name: {0: BATCH_AXIS} for name in (*inputs, *outputs)})


class Task:
    """One task's answers to what the core asks. Subclasses set the class attributes and override the methods.

    name: the registry key, the `task` a DataInfo and a recipe name; title: its name in a sentence; description: one line for `trainforge recipes`.
    metrics: what evaluation reports (val rows, eval.json), loss first; default_metric: what early stopping, tune,
    `runs compare` and compress's recommendation optimize by default; higher_is_better: the metrics to maximize.
    generates: the model samples sequences (`trainforge generate`, a chat run's answers at each evaluation).
    predict_refusal: None when `trainforge predict` serves an exported model of this task, else why not.
    ordered_splits: a contiguous stream (a corpus) is split into contiguous val/test ranges, not drawn at random.
    token_augmentation: the data's token augmentation (data.augment.token_*) applies to this task's text.
    quality: (compress's metric key, its short label, its long label) for the compression table.
    """

    name: str = ""
    title: str = ""  # the task in a sentence: "language modelling"
    description: str = ""
    metrics: tuple[str, ...] = ("loss",)
    default_metric: str = "loss"
    higher_is_better: frozenset[str] = frozenset()
    generates: bool = False

    @property
    def predict_refusal(self) -> Optional[str]:  # a subclass may set a class attribute instead
        """None when `trainforge predict` serves this task's exported models (it defines `predictions`), else why not."""
        return None if type(self).predictions is not Task.predictions else "its task defines no predictions"
    # the per-class columns `trainforge eval` prints (None: every one; the rest are in --json and eval.json)
    console_per_class: Optional[tuple[str, ...]] = None
    # None when compress exports this task's models to ONNX, else why not (one line, said before anything is loaded)
    export_refusal: Optional[str] = None
    # the exported graph's fixed batch (a detector's graph takes one image: `serve` calls it once per image), or None
    # for a graph whose batch axis is dynamic
    export_batch_size: Optional[int] = None
    # the batch `trainforge predict` serves the exported model at: compress recommends a variant by its latency
    # there (1: a detector, called image by image; 32, the throughput column, for a task served in batches)
    served_batch: int = 32
    # None when the planner simulates this task's training step on fake tensors, else why it cannot (`plan` says it
    # in one line; `micro_batch_size: auto` takes the whole per-process batch and leaves the rest to OOM recovery)
    simulation_refusal: Optional[str] = None
    ordered_splits: bool = False
    token_augmentation: bool = False
    # the validation metrics (fractions, higher is better) the run report charts over training, on one 0..1 axis,
    # beside the loss: a detector's mAP, a segmenter's mIoU (classification's and perplexity's charts are the report's)
    chart_metrics: tuple[str, ...] = ()
    # detailed results too large for every validation row of metrics.jsonl: eval.json (the final test) only
    final_only: tuple[str, ...] = ()
    quality: tuple[str, str, str] = ("loss", "loss", "test loss")
    # the named training losses `train.loss` may choose (the first is the task's default); () for a task of one loss
    losses: tuple[str, ...] = ()
    # the training loss weighs classes (`train.class_weights`: training_loss takes class_weights, one per class)
    class_weighted: bool = False

    @property
    def distill_refusal(self) -> Optional[str]:  # a subclass may set a class attribute instead
        """None when `compress --distill` can train a student of this task from its teacher (it defines
        `class_logits`), else why not (one line, said before anything is pruned)."""
        if type(self).class_logits is not Task.class_logits:
            return None
        return f"{self.title or self.name} defines no distillation; drop --distill (the pruned model is fine-tuned " \
               "with the task's own loss)"

    # ---- metrics
    def direction(self, metric: str) -> str:
        """"max" or "min": which way `metric` improves."""
        return MAX if metric in self.higher_is_better else MIN

    def check_loss(self, loss: str, field: str) -> None:
        """`loss` is a training loss this task can use, else UserError naming `field`."""
        if loss not in self.losses:
            choices = (f"choose one of {', '.join(self.losses)}" if self.losses
                       else "this task has one training loss: remove the setting")
            raise UserError(f"{field}: {loss!r} is not a {self.title} loss; {choices}")

    def check_metric(self, metric: str, field: str) -> None:
        """`metric` is one evaluation reports for this task, else UserError naming `field`."""
        if metric not in self.metrics:
            raise UserError(f"{field}: {metric!r} is not reported for {self.name}; choose one of "
                            f"{', '.join(self.metrics)}")

    # ---- a batch: what the loader yields (the task's collate of its samples) and the loop hands to the model
    def collate(self, samples: list) -> Any:
        """One batch of `samples` (torch's default collate: a pair of stacked tensors, for (x, y) samples)."""
        from torch.utils.data import default_collate

        return default_collate(samples)

    def collator(self, info: Any, train: bool) -> Any:
        """The collate of this data's batches, in training (`train`) or evaluation: `collate` by default; a task whose
        batching needs the data's facts (a point cloud's pillar grid, its pillar cap in training and in evaluation)
        returns one bound to them (picklable: the loader's workers call it)."""
        return self.collate

    def inputs(self, batch: Any) -> Any:
        """What the model is called with."""
        return batch[0]

    def target(self, batch: Any) -> Any:
        """What the loss and the metrics compare the output with."""
        return batch[1]

    def forward(self, model: Any, batch: Any) -> Any:
        """The model's output on `batch` (called under the run's autocast). A model that returns its own losses
        (torchvision's detectors, HF models given labels) is called with the targets here."""
        return model(self.inputs(batch))

    def training_loss(self, output: Any, batch: Any, *, label_smoothing: float = 0.0,
                      loss: Optional[str] = None) -> "torch.Tensor":
        """The scalar the loop backpropagates: the task's loss of the float output (a model's own loss dict, summed);
        `loss`: one of `losses` (train.loss), None for the default."""
        return self.loss(output.float(), self.target(batch), label_smoothing=label_smoothing)

    # ---- distillation (compress --prune --distill)
    def class_logits(self, output: "torch.Tensor") -> "torch.Tensor":
        """The output as rows of class logits, (rows, classes): what distillation's KL term compares, row by row."""
        raise NotImplementedError

    def distill_loss(self, output: Any, teacher_output: Any, batch: Any, *, temperature: float,
                     alpha: float) -> "torch.Tensor":
        """alpha * KL(softmax(teacher/T) || softmax(student/T)) * T^2 + (1 - alpha) * the task's own loss (Hinton et
        al. 2015; T^2 keeps the soft term's gradients on the hard term's scale), the KL over the class dimension of
        each row `class_logits` makes (a sample, a token, a pixel), averaged over rows."""
        soft = soft_kl(self.class_logits(output.float()), self.class_logits(teacher_output.float()), temperature)
        return alpha * soft + (1.0 - alpha) * self.training_loss(output, batch)

    def example_batch(self, info: Any, inputs: Any, batch_size: int) -> Any:
        """The batch the planner simulates and `micro_batch_size: auto` sizes, around the model's example `inputs`
        (its InputSpec's, of `batch_size` samples)."""
        return (inputs, self.example_target(info, batch_size).to(_device_of(inputs)))

    # ---- training
    def loss(self, output: "torch.Tensor", target: "torch.Tensor", *, label_smoothing: float = 0.0,
             reduction: str = "mean") -> "torch.Tensor":
        raise NotImplementedError

    def evaluation(self, info: Any) -> "Evaluation":
        """A fresh accumulator of one evaluation pass."""
        return Evaluation(self)

    # ---- planning and export
    def example_target(self, info: Any, batch_size: int) -> "torch.Tensor":
        """A target batch of the right shape and dtype (its values do not change memory or FLOPs)."""
        raise NotImplementedError

    def tokens_per_sample(self, info: Any) -> int:
        """Tokens one sample carries (throughput in tokens/s); 1 for a sample that is not a sequence."""
        return 1

    def output_shape(self, input_shape: tuple[int, ...], num_classes: int) -> tuple[int, ...]:
        """The model output's shape for one batch (-1: the batch) given one sample's input shape: the exported
        signature (ONNX, MLflow)."""
        raise NotImplementedError

    def score_logits(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, Optional[float]]:
        """Compress's quality columns of an exported variant, from its outputs in numpy."""
        raise NotImplementedError

    # ---- export (compress) and serving (predict): numpy and onnxruntime, torch only where a method says so
    def export_signature(self, info: Any) -> ExportSignature:
        """The ONNX graph's names: one input `input` (a model of several inputs: each by its DataInfo name, in order)
        and one output `logits`, each dynamic along the batch."""
        named = info.named_inputs()
        return ExportSignature.batched([INPUT_NAME] if len(named) == 1 else [i.name for i in named], [OUTPUT_NAME])

    def served_inputs(self, info: Any) -> list[dict[str, Any]]:
        """What `trainforge predict` feeds `serve` (the artifact's `inputs`: name, shape, dtype, modality; -1 for a
        dimension of any length). By default the graph's own inputs; a task that prepares the graph's inputs inside
        `serve` (3D detection cuts a frame's points into pillars) names what it takes instead."""
        return [{"name": name, "shape": list(i.shape), "dtype": i.dtype, "modality": i.modality}
                for name, i in zip(self.export_signature(info).inputs, info.named_inputs())]

    def graph_feeds(self, feeds: Feeds, info: Any) -> Feeds:
        """A batch of served feeds as the graph itself takes them (int8 calibration runs the graph on these): the
        same by default; a task whose `serve` prepares the graph's inputs prepares them here too."""
        return feeds

    def export_module(self, model: Any, info: Any) -> Any:
        """The torch module that is exported: takes the signature's inputs positionally and returns its outputs (a
        tensor, or a tuple in the signature's order). By default the model itself; a model of several inputs is
        called with the dict of them."""
        names = [i.name for i in info.named_inputs()]
        if len(names) == 1:
            return model
        from trainforge.tasks.exporting import PositionalInputs

        return PositionalInputs(model, names)

    def export_feeds(self, batch: Any, info: Any) -> Feeds:
        """A collated batch's inputs as the exported graph takes them ({ONNX input name: numpy array})."""
        x = self.inputs(batch)
        names = self.export_signature(info).inputs
        if isinstance(x, dict):
            return {name: x[name].detach().cpu().numpy() for name in names}
        return {names[0]: x.detach().cpu().numpy()}

    def export_example(self, feeds: Feeds, info: Any) -> Feeds:
        """The inputs the graph is traced with, from two training samples as evaluation reads them: as they are by
        default; a task whose model takes a smaller input than it is served (a volume's training patch) cuts it."""
        return feeds

    def serve(self, run: Runner, feeds: Feeds, meta: dict[str, Any]) -> dict[str, np.ndarray]:
        """The exported model's outputs on a batch of `feeds` (`run`: one onnxruntime call). A task whose
        inference is more than one call (a sliding window over a volume) makes its calls here."""
        return run(feeds)

    def score_outputs(self, outputs: dict[str, np.ndarray], batch: Any, info: Any) -> dict[str, Optional[float]]:
        """Compress's quality columns of an exported variant: its outputs on the whole test split (`batch`, the
        task's collate of it). By default `score_logits` of the one output against the target."""
        (logits,) = outputs.values()
        return self.score_logits(logits, self.target(batch).cpu().numpy())

    def predictions(self, outputs: dict[str, np.ndarray], meta: dict[str, Any], *, top_k: int) -> list[dict[str, Any]]:
        """What `trainforge predict` reports for each sample of a batch (JSON-able, without the input's name), from
        the exported model's outputs; `meta`: the artifact's metadata (class names and the like)."""
        raise NotImplementedError(f"{self.name}: predict does not serve this task")

    # the keys of a prediction `trainforge predict` shows as table columns (--json shows all of it)
    prediction_columns: tuple[str, ...] = ()

    def prediction_image(self, sample: Feeds, output: dict[str, np.ndarray], prediction: dict[str, Any],
                         meta: dict[str, Any]) -> Optional[np.ndarray]:
        """A picture of one prediction where one helps (`predict --images DIR`): an (H, W, 3) uint8 array (a
        detector's boxes drawn on its image, a volume's mask over a slice), or None. `sample` and `output`: the one
        sample's inputs as the graph took them and its outputs as `serve` gave them; `prediction`: its report."""
        return None


def soft_kl(student: "torch.Tensor", teacher: "torch.Tensor", temperature: float) -> "torch.Tensor":
    """KL(softmax(teacher/T) || softmax(student/T)) * T^2 over the last dimension, averaged over the rows."""
    import torch.nn.functional as F

    t = float(temperature)
    return F.kl_div(F.log_softmax(student / t, dim=-1), F.log_softmax(teacher / t, dim=-1), reduction="batchmean",
                    log_target=True) * (t * t)


class Evaluation:
    """Sums a pass's loss (no label smoothing) over the units the task averages over; a task adds its metrics."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.loss_sum, self.count = 0.0, 0

    def add_batch(self, output: Any, batch: Any) -> None:
        """One evaluated batch (the model in eval mode): by default the float output against the task's target."""
        self.add(output.float(), self.task.target(batch))

    def add(self, output: "torch.Tensor", target: "torch.Tensor") -> None:
        self.loss_sum += float(self.task.loss(output, target, label_smoothing=0.0, reduction="sum"))
        self.count += target.numel()

    @property
    def mean_loss(self) -> Optional[float]:
        """The pass's mean loss; None for a task whose model gives no loss in eval mode (torchvision's detectors)."""
        return self.loss_sum / self.count

    def result(self, detailed: bool) -> dict[str, Any]:
        """The task's metrics (the loss is reported by the caller); `detailed`: per-class tables and the like."""
        return {}

    def picture(self) -> Optional[np.ndarray]:
        """The pass's first images (the same ones each evaluation: the split is not shuffled) with what the model
        predicted and what is true drawn on them, as one (H, W, 3) uint8 grid, for a task where a picture helps (a
        detector's boxes, a segmenter's masks): the run report's validation images. None by default."""
        return None


def mean_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """(mean cross-entropy in nats, the logits flattened to (rows, classes)) in float64 numpy."""
    flat = logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    y = labels.reshape(-1)
    shifted = flat - flat.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].mean()), flat


TASKS: Registry[Task] = Registry("task", "task")


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: registers one instance under `cls.name`."""
    assert cls.name and cls.description, f"{cls.__name__}: a task needs a name and a description"
    TASKS.register(cls.name)(cls())
    return cls


def task_of(info: Any) -> Task:
    """The task a DataInfo (or anything with `.task`) is for."""
    return TASKS.get(info.task)


def _device_of(inputs: Any) -> Any:
    from trainforge.tasks.batch import batch_device

    return batch_device(inputs)


def finite_exp(value: float) -> float:
    """exp(value), inf instead of an OverflowError."""
    return math.exp(value) if value < math.log(np.finfo(np.float64).max) else float("inf")
