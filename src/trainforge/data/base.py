"""What the rest of trainforge knows about a dataset: its `DataInfo` and the `DataBundle` of splits."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

from torch.utils.data import Dataset

Task = str  # a task registered in trainforge.tasks.TASKS
ModalityName = str  # a modality registered in trainforge.data.modalities.MODALITIES (image, text, tabular, ...)


@dataclass(frozen=True)
class InputInfo:
    """One named input of a sample: what a model of several inputs (an image and a feature vector) is told."""

    name: str
    shape: tuple[int, ...]  # one sample, without the batch dimension
    dtype: Literal["float32", "int64"]
    modality: ModalityName


@dataclass(frozen=True)
class DataInfo:
    """Shape facts a model factory, the planner and the exporter need; no samples. `task` names a task of
    trainforge.tasks (what a sample's target is, and everything the task decides).

    classification: x is float32 (image: C,H,W; tabular: F) or int64 tokens (text: T); y is int64 ().
    lm: x and y are int64 (T,); y is x shifted by one token.
    """

    task: Task
    modality: ModalityName
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    input_dtype: Literal["float32", "int64"]
    num_classes: int  # classification: number of classes; lm: vocab size
    class_names: tuple[str, ...] = ()
    vocab_size: Optional[int] = None  # token inputs only
    seq_len: Optional[int] = None  # token inputs only
    pad_id: Optional[int] = None  # the padding id of fixed-length token inputs (models mask it out)
    # a sample of several named inputs (a dict; the task's collate batches it): each one's shape, dtype and modality.
    # Empty for one input, which input_shape, input_dtype and modality describe (`named_inputs` gives it a name).
    inputs: tuple[InputInfo, ...] = ()
    # point clouds: the pillars a frame is cut into (data.args): x_min, y_min, z_min, x_max, y_max, z_max (metres,
    # point_cloud_range), a pillar's x, y, z size (voxel_size), max_points_per_voxel, max_voxels in training and in
    # evaluation; empty for other data
    pillar_grid: tuple[float, ...] = ()

    def named_inputs(self) -> tuple[InputInfo, ...]:
        return self.inputs or (InputInfo("x", tuple(self.input_shape), self.input_dtype, self.modality),)


@dataclass
class DataBundle:
    """The three splits plus what was learned about the data.

    `train[(epoch, index)]` returns (x, y) with augmentation drawn from a generator seeded by
    (seed, epoch, index), so a sample's randomness depends on its position, never on history.
    `val[index]` and `test[index]` return (x, y) with no augmentation.
    `preprocess` is JSON-able (normalization statistics, tokenizer, image size): stored with the model.
    `report` is JSON-able: written to data_report.json.
    `runtime_report`, when the data can find problems only while it is read (image files that fail to decode):
    what was found so far, by every process (JSON-able; the trainer adds it to data_report.json at the end).
    """

    info: DataInfo
    train: Dataset
    val: Dataset
    test: Dataset
    preprocess: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    runtime_report: Optional[Callable[[], dict[str, Any]]] = None
