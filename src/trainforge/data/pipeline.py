"""source -> clean -> [model's resize + crop] -> split -> normalize (fit on train) -> augment (train only) -> DataBundle.

What a kind of samples needs on the way (cleaning, tokenizing, packing, which split) the pipeline asks of the samples
(`Samples` in data/pool.py) instead of testing their class; what follows from the kind of values they hold
(normalization, augmentation, a pretrained model's preprocessing, the tokenizer, the record) it asks of their
modality (`MODALITIES` in data/modalities). A new kind of samples or of input needs no change here."""
from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Iterator, Optional

import numpy as np
import torch

from trainforge.config import AugmentConfig, DataConfig
from trainforge.data.base import DataBundle, DataInfo
from trainforge.data.image.preprocess import TENSOR_FILTERS, ImagePreprocess, resolve_image_preprocess
from trainforge.data.modalities import MODALITIES, Modality
from trainforge.data.pool import Pool, Samples, SampleUnreadable
from trainforge.data.sources import SOURCES
from trainforge.data.stages.augment import ALL_OPS
from trainforge.data.stages.clean import drop_failed_before
from trainforge.data.stages.datasets import EvalDataset, TrainDataset
from trainforge.data.stages.loader import ShardOrder
from trainforge.data.stages.normalize import Normalizer, fit_normalizer, identity, model_normalizer
from trainforge.data.stages.split import Splits, carve_val, contiguous_split, group_split, groups_per_split, random_split
from trainforge.errors import UserError
from trainforge.tasks import TASKS, task_of

MAX_STATS_SAMPLES = 2000  # normalization of lazily loaded/generated data looks at this many train samples (seeded)
STATS_CHUNK = 256


def build_data(cfg: DataConfig, *, seed: int, stored: Optional[dict[str, Any]] = None,
               fit_stats: bool = True) -> DataBundle:
    """Build the train/val/test datasets described by `cfg` (the `data` section of a recipe).

        bundle = build_data(cfg.data, seed=cfg.seed)
        x, y = bundle.train[(epoch, index)]     # augmented (images), normalized
        x, y = bundle.val[index]                # normalized only
        json.dump(bundle.report, f)             # -> data_report.json

    `stored`: the preprocessing record of a trained model or checkpoint (eval, compress, resume): its tokenizer
    and its image preprocessing (`data.normalize: model`) are used as they are, never loaded or trained anew.
    `fit_stats=False` (`plan`, the job admission, tune's and the launcher's checks: shapes, class counts and sizes
    only): normalization is not fitted, so no image is decoded; the bundle is not for training.
    Raises UserError for any problem with the config, the files or the data.
    """
    result = SOURCES.get(cfg.source)(cfg, seed=seed)  # a custom source's module may register its task first
    task = TASKS.get(cfg.task) if cfg.task is not None else None  # UserError naming `task` when unknown
    made = result.info.task
    if task is not None and made != task.name:
        raise UserError(f"task: {task.name}: data.source {cfg.source} gives {made} data ({TASKS.get(made).description})"
                        f"; remove `task:` or choose a source (or data.args) that makes {task.name} data")
    if isinstance(result, DataBundle):  # a custom factory built everything itself
        return result
    pool = result
    if cfg.group_by is not None and pool.groups is None:
        raise UserError(f"data.group_by: data.source {cfg.source!r} has no columns to group by; group samples with "
                        "an index that names them (volumes, multimodal, csv, jsonl, an imagefolder index)",
                        public=True)
    if cfg.group_by is not None:
        pool.notes = {**pool.notes, "group_by": cfg.group_by}
    pool = pool.samples.before_split(pool, cfg, stored)  # cleaned; a corpus or conversations tokenized
    if pool.failed_before is not None:  # files an earlier run could not decode (image folders)
        pool = drop_failed_before(pool, stored)
    if len(pool.samples) == 0:
        raise UserError(
            f"data: no usable samples left from data.source={cfg.source!r} "
            f"(dropped: {pool.drops.counts}); check data.path and data.args",
            public=True,
        )
    spec = None
    if cfg.normalize == "model":
        spec = model_preprocessing(pool, cfg, stored)
        if spec is not None:
            pool = preprocess_images(pool, spec, cfg)
    splits, method = split_pool(pool, cfg, seed)
    pool, splits = pool.samples.after_split(pool, splits, cfg, stored)  # texts tokenized; conversations packed
    info = pool.info
    modality = MODALITIES.get(info.modality)
    if cfg.tokenizer is not None and not modality.takes_tokenizer:
        warnings.warn(f"data.tokenizer ignored: data.source={cfg.source!r} gives {info.modality} data, not text")
    scaled = modality.scaled
    sampled: dict[str, Any] = {}
    if spec is not None:
        normalizer = model_normalizer(spec.mean, spec.std, pool.value_range)
    elif not fit_stats:
        normalizer = identity()
    else:
        normalizer = fit_pool_normalizer(pool, splits["train"], cfg.normalize if scaled else "none", seed, sampled)
    normalize = None if normalizer.kind == "none" else normalizer
    augment = choose_augment(cfg.augment, info, pool.value_range, modality)
    if augment is not None or getattr(pool.samples, "crops", False):  # boxes and masks move with the pixels;
        augment = pool.samples.target_augment(augment)  # a volume's training patch is cropped, augmented or not

    preprocess: dict[str, Any] = {"modality": info.modality, "task": info.task, **pool.preprocess}
    if scaled:
        preprocess["normalize"] = normalizer.to_json()
    preprocess.update(modality.record(pool.value_range))
    if info.class_names:
        preprocess["class_names"] = list(info.class_names)
    return DataBundle(
        info=info,
        train=TrainDataset(pool.samples, splits["train"], seed=seed, augment=augment, normalize=normalize,
                           order=None if pool.train_shards is None else ShardOrder(pool.train_shards)),
        val=EvalDataset(pool.samples, splits["val"], normalize),
        test=EvalDataset(pool.samples, splits["test"], normalize),
        preprocess=preprocess,
        report=data_report(cfg.source, pool, splits, method, normalizer, sampled),
        runtime_report=getattr(pool.samples, "runtime_failures", None),
    )


def model_preprocessing(pool: Pool, cfg: DataConfig, stored: Optional[dict[str, Any]]) -> Optional[ImagePreprocess]:
    """`data.normalize: model`: the stored preprocessing when there is one (eval, compress, resume: the model's
    library is not asked again), else data.from_model's, resolved now. None (with a warning) for text."""
    modality = MODALITIES.get(pool.info.modality)
    if modality.model_preprocessing != "apply":
        why = f"data.source={cfg.source!r} gives {modality.name} data; the model's preprocessing is for images"
        if modality.model_preprocessing == "refuse":
            raise UserError(f"data.normalize: 'model' does not apply: {why}; use zscore, minmax or none", public=True)
        warnings.warn(f"data.normalize: model ignored: {why}")
        return None
    if stored is not None and stored.get("image_preprocess"):
        return ImagePreprocess.from_json(stored["image_preprocess"])
    if cfg.from_model is None:
        raise UserError("data.normalize: model needs data.from_model {family, source}: whose preprocessing (a recipe "
                        "fills it from its model section)", public=True)
    return resolve_image_preprocess(cfg.from_model)


class ModelSizedTensors(Samples):
    """The samples of a source that holds images as tensors (digits, synthetic images, a custom source), resized
    and cropped as the pretrained model expects; the pixel scale stays the source's."""

    def __init__(self, samples: Samples, spec: ImagePreprocess) -> None:
        self.samples, self.spec = samples, spec

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.samples[index]
        return self.spec.apply_tensor(x), y


def preprocess_images(pool: Pool, spec: ImagePreprocess, cfg: DataConfig) -> Pool:
    """Samples as the model expects them: a source that has the images themselves (files, PIL images) reads them
    with Pillow as the model's library does (and as predict does); one with tensors resizes them with torchvision.
    The model sees the crop size: info.input_shape and the preprocessing record say so."""
    h, w = spec.output_hw
    own = getattr(pool.samples, "with_image_preprocess", None)
    if own is not None:
        if "image_size" in cfg.args:
            warnings.warn(f"data.args.image_size ignored: data.normalize: model resizes and crops to the model's "
                          f"{h}x{w} ({spec.origin})")
        pool.samples = own(spec)
    else:
        channels = pool.info.input_shape[0]
        if not (channels == spec.channels or (channels == 1 and spec.channels == 3)):  # gray is repeated to RGB
            raise UserError(f"data.normalize: model: {spec.origin} takes {spec.channels}-channel images, "
                            f"data.source={cfg.source!r} gives {channels}; use data.normalize zscore", public=True)
        if spec.interpolation not in TENSOR_FILTERS:
            raise UserError(f"data.normalize: model: {spec.origin} resizes with {spec.interpolation}, which "
                            f"torchvision does not do on tensors (data.source={cfg.source!r}); use an image folder "
                            "or data.normalize zscore", public=True)
        pool.samples = ModelSizedTensors(pool.samples, spec)
    pool.info = replace(pool.info, input_shape=spec.output_shape)
    pool.preprocess = {**pool.preprocess, "image_size": h if h == w else [h, w], "channels": spec.channels,
                       "image_preprocess": spec.to_json()}
    pool.notes = {**pool.notes, "image_preprocess": spec.describe()}
    return pool


def choose_augment(cfg: AugmentConfig, info: DataInfo, value_range: tuple[float, float],
                   modality: Optional[Modality] = None) -> Any:
    """The train-split augmenter for this data, the modality's (None when none is switched on); a warning names
    each setting that is switched on and does not apply."""
    modality = modality or MODALITIES.get(info.modality)
    augment, applies, why = modality.augmenter(cfg, info, value_range, task_of(info))
    _warn_ignored([n for n in ALL_OPS if getattr(cfg, n) and n not in applies], why)
    return augment


def _warn_ignored(names: list[str], why: str) -> None:
    if names:
        keys = ", ".join(f"data.augment.{n}" for n in names)
        warnings.warn(f"{keys} ignored: {why}")


def split_pool(pool: Pool, cfg: DataConfig, seed: int) -> tuple[Splits, str]:
    n = len(pool.samples)
    if pool.splits is not None:  # prepared shards keep the splits they were written with
        return pool.splits, "prepared"
    if pool.groups is not None:
        assert pool.test_indices is None and cfg.group_by is not None
        return group_split(pool.labels, pool.groups, cfg.val_fraction, cfg.test_fraction, seed, cfg.group_by)
    if pool.test_indices is not None:
        return carve_val(pool.labels, n, pool.test_indices, cfg.val_fraction, seed)
    if task_of(pool.info).ordered_splits and pool.samples.contiguous:
        return contiguous_split(n, cfg.val_fraction, cfg.test_fraction), "contiguous"
    return random_split(pool.labels, n, cfg.val_fraction, cfg.test_fraction, seed)


def stats_sample(train: np.ndarray, seed: int) -> np.ndarray:
    """The train indices normalization is fitted on: all of them, or MAX_STATS_SAMPLES drawn at random without
    replacement by a generator seeded with `seed` (the same in every process and run), in index order."""
    if len(train) <= MAX_STATS_SAMPLES:
        return train
    return np.sort(np.random.default_rng(seed).choice(train, MAX_STATS_SAMPLES, replace=False))


def stats_batches(pool: Pool, train: np.ndarray, seed: int, sampled: dict[str, Any]) -> Iterator[torch.Tensor]:
    """Raw train samples in batches: all of them when in memory, else `stats_sample`'s (a sample that cannot be
    read is skipped). `sampled` gets what was looked at (lazy samples only): samples, of, seed, unreadable."""
    samples = pool.samples
    held = samples.in_memory(train)
    if held is not None:
        yield held
        return
    chosen = stats_sample(train, seed)
    sampled.update(samples=len(chosen), of=len(train), seed=seed, unreadable=0)
    for start in range(0, len(chosen), STATS_CHUNK):
        batch = []
        for i in chosen[start : start + STATS_CHUNK]:
            try:
                batch.append(samples[int(i)][0])
            except SampleUnreadable:
                sampled["unreadable"] += 1
        if batch:
            yield torch.stack(batch)


def fit_pool_normalizer(pool: Pool, train: np.ndarray, kind: str, seed: int = 0,
                        sampled: Optional[dict[str, Any]] = None) -> Normalizer:
    if kind == "none":
        return identity()
    return fit_normalizer(kind, stats_batches(pool, train, seed, {} if sampled is None else sampled),
                          MODALITIES.get(pool.info.modality).channel_view)


def data_report(
    source: str, pool: Pool, splits: Splits, method: str, normalizer: Normalizer,
    sampled: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """The JSON-able content of data_report.json."""
    report: dict[str, Any] = {
        "source": source,
        "rows_read": pool.rows_read,
        "rows_kept": len(pool.samples) if pool.rows_kept is None else pool.rows_kept,
        "dropped": dict(pool.drops.counts),
        "dropped_examples": {k: list(v) for k, v in pool.drops.examples.items()},
        "splits": {name: len(idx) for name, idx in splits.items()},
        "split_method": method,
    }
    if pool.groups is not None:  # checked: no group is in two splits
        report["groups_per_split"] = groups_per_split(pool.groups, splits)
    if pool.labels is not None:
        report["class_counts"] = {
            name: class_counts(pool.labels[idx], pool.info.class_names) for name, idx in splits.items()
        }
    report["normalization"] = normalizer.to_json()
    if sampled:  # which train samples the statistics come from
        report["normalization"]["sample"] = dict(sampled)
    feature_names = pool.preprocess.get("feature_names")
    if feature_names and normalizer.kind != "none":
        report["normalization"]["constant_feature_names"] = [
            feature_names[i] for i in normalizer.stats["constant_features"]
        ]
    report.update(pool.notes)
    if pool.labels is not None and pool.notes.get("classes_declared") is False:
        # classes inferred from the labels: a label kept once (a typo, an id column) became a class of its own
        once = np.flatnonzero(np.bincount(pool.labels, minlength=len(pool.info.class_names)) == 1)
        report["classes_seen_once"] = [pool.info.class_names[i] for i in once]
    return report


def class_counts(labels: np.ndarray, names: tuple[str, ...]) -> dict[str, int]:
    counts = np.bincount(labels, minlength=len(names))
    return {name: int(c) for name, c in zip(names, counts)}
