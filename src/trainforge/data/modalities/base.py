"""What a kind of input is, as a plug-in: `Modality` and its registry `MODALITIES` (torch-free).

    modality = MODALITIES.get(info.modality)       # UnknownNameError naming the registered ones
    modality.channel_view                          # how per-channel normalization broadcasts over one sample
    modality.augmenter(cfg.augment, info, value_range, task)   # the train split's augmenter, or None
    read = modality.reader(meta, "model.onnx")     # predict: the user's files -> samples, as training prepared them

A source's samples (data/pool.py `Samples`) read, clean and cache the records of their format; what follows from the
kind of values they hold is asked of the modality here: whether normalization is fitted on them and how it
broadcasts, which augmentation applies, whether a pretrained model's preprocessing and a tokenizer apply, what the
preprocessing record keeps, and how `trainforge predict` reads a user's file. The pipeline,
the normalizer and serving ask; none of them names a modality. A new kind of input is one module that subclasses
`Modality` and calls `register_modality` (docs/architecture.md "Adding a modality").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, BinaryIO, Callable, ClassVar, Iterator, Optional, Sequence

import numpy as np

from trainforge.errors import UserError
from trainforge.registry import Registry

if TYPE_CHECKING:  # annotations only: this module imports neither torch nor the data pipeline
    from trainforge.config import AugmentConfig
    from trainforge.data.base import DataInfo

# (the input as the user knows it, one sample without the batch dimension[, where it came from: {"fit": ...} for an
# image fitted to the model's input, so the task can answer in the file's pixels])
Sample = tuple
Reader = Callable[[Sequence[str]], Iterator[Sample]]


class Modality:
    """One kind of input. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    description: ClassVar[str]
    # dimensions after the channel (or feature) axis of one sample: image (C, H, W) 2, volume (C, D, H, W) 3;
    # 0 for a vector of features or of tokens
    spatial_dims: ClassVar[int] = 0
    scaled: ClassVar[bool] = False  # values that data.normalize (zscore, minmax) is fitted on
    takes_tokenizer: ClassVar[bool] = False  # data.tokenizer applies
    # data.normalize: model (a pretrained model's resize, crop and statistics): "apply", "refuse" (a clear error)
    # or "ignore" (a warning)
    model_preprocessing: ClassVar[str] = "ignore"
    served: ClassVar[str] = ""  # what `trainforge predict` reads for this modality ("" when only arrays)
    # file suffixes the reader takes that predict would otherwise read as arrays (a point cloud's .npy)
    own_suffixes: ClassVar[tuple[str, ...]] = ()

    @property
    def channel_view(self) -> tuple[int, ...]:
        """How per-channel (or per-feature) parameters broadcast over one sample: (-1, 1, 1) for (C, H, W)."""
        return (-1,) + (1,) * self.spatial_dims

    def augmenter(self, cfg: "AugmentConfig", info: "DataInfo", value_range: tuple[float, float],
                  task: Any) -> tuple[Any, tuple[str, ...], str]:
        """(the train split's augmenter or None, the data.augment settings that apply here, why the others do not).
        `task`: the data's task (trainforge.tasks), whose `token_augmentation` says whether token ops apply."""
        what = f"{self.name} data" if task.token_augmentation else task.title
        return None, (), f"augmentation applies to images, volumes, point clouds and text classification, not {what}"

    def record(self, value_range: tuple[float, float]) -> dict[str, Any]:
        """What the preprocessing record (stored with the model) keeps for this modality besides normalization."""
        return {}

    def reader(self, meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
        """`trainforge predict`'s reader of the user's files for a model whose one input is of this modality (the
        artifact's metadata checked once). Raises UserError for a modality predict reads only as arrays."""
        raise UserError(f"INPUT: a {self.name} model reads .npz or .npy arrays (one array per input name); "
                        "pass those")


MODALITIES: Registry[Modality] = Registry("modality", "data modality")


def register_modality(cls: type[Modality]) -> type[Modality]:
    """Register one instance of `cls` under `cls.name` (a decorator; a plug-in module calls it at import)."""
    MODALITIES.register(cls.name)(cls())
    return cls
