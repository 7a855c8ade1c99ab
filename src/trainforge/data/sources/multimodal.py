"""`multimodal`: samples of several inputs, for fusion models: an index (`.csv`, `.jsonl`, `.parquet`) whose columns give,
per sample, one or more images (paths relative to the index's folder, never outside it), numeric features,
categorical features and a label.

    data:
      source: multimodal
      path: drives/index.csv
      args: {images: [camera], features: [speed, lidar_range], categorical: [weather], missing: zero}

A sample is a dict of named inputs and its class: each image column by its name (float32 (C, S, S) in [0, 1], read
as the image folder reads images), `features` (the numeric columns, then a one-hot of each categorical column, its
categories sorted; z-scored by the train split's mean and std, fitted after the split like every normalization)
and, under `missing: zero`, `present` (1.0 per modality that is there, 0.0 where it was zero-filled).

A modality is missing in a row when its cell is empty (or a numeric cell is empty or NaN, or an image file is not
there). `missing: drop` (the default) drops the row, counted per modality as `missing_<column>` (features:
`missing_features`); `missing: zero` keeps it with zeros in its place and the mask saying so, counted in
data_report.json `missing_modalities`. A cell of the wrong type (a text in a numeric column, a number or a non-image
path in an image column) is one line naming the column and the row: the index is wrong, not the sample.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Any, Literal, Optional, Union

import numpy as np
import torch
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo, InputInfo
from trainforge.data.formats.manifest import IMAGE_SUFFIXES
from trainforge.data.pool import DropLog, Pool, Samples, SampleUnreadable
from trainforge.data.sources.common import (INDEX_SUFFIXES, MISSING_GROUP, SOURCES, SourceArgs, class_names_for,
                                            group_reasons, label_notes, label_text, no_group_column, parse_args,
                                            read_index, require_path, under_index)
from trainforge.errors import UserError, quote

WHAT = "an index (.csv, .jsonl, .parquet) with a label column and image, feature or categorical columns"
FEATURES = "features"  # the input holding the numeric and one-hot categorical features
PRESENT = "present"  # under missing: zero, the input saying which modalities are there
STD_FLOOR = 1e-6


class MultimodalArgs(SourceArgs):
    images: list[str] = Field(default_factory=list, max_length=8)  # columns of image paths
    features: list[str] = Field(default_factory=list, max_length=4096)  # numeric columns
    categorical: list[str] = Field(default_factory=list, max_length=256)  # categorical columns, one-hot encoded
    label_column: str = "label"
    classes: Optional[list[Union[str, int]]] = None
    image_size: int = Field(64, gt=0, le=4096)
    grayscale: bool = False
    missing: Literal["drop", "zero"] = "drop"


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip()) or (
        isinstance(value, float) and math.isnan(value))


def number(value: Any, column: str, where: str, index: str) -> Optional[float]:
    """A numeric cell as a float, None when empty; a cell of another type is a UserError naming the column."""
    if _empty(value):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"data.args.features: column {quote(column)} of {index} holds {quote(value)} ({where}), not a "
                        "number; encode it as numbers, or list it under data.args.categorical", public=True)
    try:
        v = float(value)
    except OverflowError:  # an integer beyond a float's range: as a non-finite value, missing
        return None
    except ValueError:
        raise UserError(f"data.args.features: column {quote(column)} of {index} holds {quote(value)} ({where}), not a "
                        "number; encode it as numbers, or list it under data.args.categorical", public=True) from None
    return v if math.isfinite(v) else None


class MultimodalSamples(Samples):
    """Sample i: {image column: pixels, features: z-scored vector[, present: mask]} and its class. The features are
    held raw (NaN where missing) until `after_split` fits their statistics on the train split."""

    def __init__(self, ids: list[str], images: dict[str, list[Optional[str]]], features: torch.Tensor,
                 labels: np.ndarray, image_size: int, grayscale: bool, masked: bool,
                 stats: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> None:
        self.ids, self.images, self.features, self.labels = ids, images, features, labels
        self.image_size, self.grayscale, self.masked, self.stats = image_size, grayscale, masked, stats

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        from trainforge.data.image.read import read_image

        assert self.stats is not None, "the features are z-scored after the split"
        x: dict[str, torch.Tensor] = {}
        present = []
        channels = 1 if self.grayscale else 3
        for column, paths in self.images.items():
            path = paths[index]
            if path is None:
                x[column] = torch.zeros((channels, self.image_size, self.image_size))
                present.append(0.0)
                continue
            try:
                x[column] = torch.from_numpy(read_image(path, self.image_size, self.grayscale))
            except Exception as e:  # Pillow raises many types for a file that does not decode
                raise SampleUnreadable(f"{self.ids[index]}: {column} {path}") from e
            present.append(1.0)
        if self.features.shape[1]:
            raw = self.features[index]
            there = not bool(torch.isnan(raw).any())
            mean, std = self.stats
            x[FEATURES] = torch.nan_to_num((raw - mean) / std, nan=0.0)  # missing: the train mean
            present.append(1.0 if there else 0.0)
        if self.masked:
            x[PRESENT] = torch.tensor(present)
        return x, torch.tensor(int(self.labels[index]))

    def subset(self, keep: np.ndarray) -> "MultimodalSamples":
        return MultimodalSamples([self.ids[i] for i in keep], {c: [p[i] for i in keep] for c, p in self.images.items()},
                                 self.features[torch.as_tensor(keep, dtype=torch.long)], self.labels[keep],
                                 self.image_size, self.grayscale, self.masked, self.stats)

    def after_split(self, pool: Pool, splits: dict[str, np.ndarray], cfg: DataConfig,
                    stored: Optional[dict[str, Any]]) -> tuple[Pool, dict[str, np.ndarray]]:
        """The features' mean and std: the stored ones (eval, resume, compress), else fitted on the train split's
        rows where they are there (a constant feature gets std 1)."""
        width = self.features.shape[1]
        if stored is not None and stored.get("feature_stats"):
            mean = torch.tensor(stored["feature_stats"]["mean"], dtype=torch.float32)
            std = torch.tensor(stored["feature_stats"]["std"], dtype=torch.float32)
        elif width:
            train = self.features[torch.as_tensor(splits["train"], dtype=torch.long)].double()
            there = train[~torch.isnan(train).any(dim=1)]
            if len(there) == 0:
                raise UserError("data: no training row has all its features; fill them in or use missing: drop",
                                public=True)
            mean, std = there.mean(dim=0), there.std(dim=0, unbiased=False)
            std = torch.where(std < STD_FLOOR, torch.ones_like(std), std)
            mean, std = mean.float(), std.float()
        else:
            mean = std = torch.zeros(0)
        self.stats = (mean, std)
        pool.preprocess = {**pool.preprocess, "feature_stats": {"mean": mean.tolist(), "std": std.tolist()}}
        return pool, splits


MAX_CATEGORIES = 1000  # of one categorical column: its one-hot is that wide in every sample


def categories_of(rows: list[dict[str, Any]], columns: list[str]) -> dict[str, list[str]]:
    """Each categorical column's categories, sorted (the one-hot's order); a column of more than MAX_CATEGORIES
    (an id, a free text) is one line, not a feature vector as wide as the index is long."""
    out = {}
    for column in columns:
        out[column] = sorted({str(r[column]).strip() for r in rows if not _empty(r.get(column))})
        if len(out[column]) > MAX_CATEGORIES:
            raise UserError(f"data.args.categorical: column {quote(column)} has {len(out[column])} distinct values, "
                            f"more than {MAX_CATEGORIES}; an id or a free text is no category: leave it out, or "
                            "encode it as numbers under data.args.features", public=True)
    return out


@SOURCES.register("multimodal")
def multimodal(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: an index; args images, features, categorical, label_column, classes, image_size, missing."""
    a = parse_args(MultimodalArgs, cfg)
    index = require_path(cfg, WHAT)
    if not index.is_file() or index.suffix.lower() not in INDEX_SUFFIXES:
        raise UserError(f"data.path: {index.name} is not an index (.csv, .jsonl, .parquet); point it at {WHAT}",
                        public=True)
    if not (a.images or a.features or a.categorical):
        raise UserError("data.args: name the inputs: images (columns of image paths), features (numeric columns), "
                        "categorical (columns of categories)", public=True)
    named = [*a.images, *a.features, *a.categorical, a.label_column]
    if len(set(named)) != len(named):
        raise UserError(f"data.args: a column is named twice among images, features, categorical and label_column "
                        f"({', '.join(named)}); name each once", public=True)
    if cfg.normalize == "model":
        raise UserError("data.normalize: 'model' is for one image input; a multimodal sample's features are z-scored "
                        "and its images read as [0, 1] pixels", public=True)
    records: list[tuple[str, dict[str, Any]]] = []
    drops = DropLog(group_reasons(cfg, ("corrupt", "missing_label",
                                        *(f"missing_{c}" for c in a.images),
                                        *(("missing_features",) if a.features or a.categorical else ()))))
    columns: set[str] = set()
    for where, record in read_index(index, cfg):
        if record is None:
            drops.drop("corrupt", where)
            continue
        columns.update(record)
        records.append((where, record))
    for column in named[:-1] + ([cfg.group_by] if cfg.group_by else []):
        if records and column not in columns:
            if column == cfg.group_by:
                raise no_group_column(cfg, index.name, sorted(columns))
            raise UserError(f"data.args: {index.name} has no column {quote(column)} (columns: "
                            f"{', '.join(sorted(columns)[:20])}); name the index's columns", public=True)
    declared = class_names_for([], a.classes) if a.classes else None
    categories = categories_of([r for _, r in records], a.categorical)
    unknown: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    ids, labels, groups = [], [], []
    images: dict[str, list[Optional[str]]] = {c: [] for c in a.images}
    features: list[list[float]] = []
    for where, record in records:
        label = label_text(record.get(a.label_column))
        if label is None or (declared is not None and label not in declared):
            drops.drop("missing_label", where)
            if label is not None:
                unknown[label] += 1
            continue
        group = None
        if cfg.group_by is not None:
            group = label_text(record.get(cfg.group_by))
            if group is None:
                drops.drop(MISSING_GROUP, where)
                continue
        paths: dict[str, Optional[str]] = {}
        for column in a.images:
            value = record.get(column)
            if _empty(value):
                paths[column] = None
                continue
            if not isinstance(value, str) or not value.strip().lower().endswith(tuple(IMAGE_SUFFIXES)):
                raise UserError(f"data.args.images: column {quote(column)} of {index.name} holds {quote(value)} "
                                f"({where}), not an image path ({', '.join(sorted(IMAGE_SUFFIXES))}); name image "
                                "columns only", public=True)
            target = under_index(index, value.strip(), where)
            paths[column] = str(target) if target.is_file() else None
        vector: list[float] = []
        numbers = [number(record.get(c), c, where, index.name) for c in a.features]
        for column in a.categorical:
            value = record.get(column)
            hot = [0.0] * len(categories[column])
            if not _empty(value):
                hot[categories[column].index(str(value).strip())] = 1.0
            else:
                numbers.append(None)  # a missing category: the features are missing
            vector += hot
        features_missing = any(v is None for v in numbers)
        gone = [c for c, p in paths.items() if p is None] + (["features"] if features_missing else [])
        if gone and a.missing == "drop":
            drops.drop(f"missing_{gone[0]}", where)
            continue
        for what in gone:
            missing[what] += 1
        row = [math.nan if v is None else v for v in numbers[:len(a.features)]] + vector
        if features_missing:
            row = [math.nan] * len(row)
        features.append(row)
        for column in a.images:
            images[column].append(paths[column])
        ids.append(where)
        labels.append(label)
        groups.append(group)
    names = class_names_for(labels, declared)
    lookup = {name: i for i, name in enumerate(names)}
    y = np.asarray([lookup[label] for label in labels], dtype=np.int64)
    width = len(a.features) + sum(len(c) for c in categories.values())
    channels = 1 if a.grayscale else 3
    inputs = [InputInfo(c, (channels, a.image_size, a.image_size), "float32", "image") for c in a.images]
    if width:
        inputs.append(InputInfo(FEATURES, (width,), "float32", "tabular"))
    masked = a.missing == "zero"
    if masked:
        inputs.append(InputInfo(PRESENT, (len(a.images) + (1 if width else 0),), "float32", "tabular"))
    first = inputs[0]
    info = DataInfo("classification", "multimodal", first.shape, "float32", len(names), tuple(names),
                    inputs=tuple(inputs))
    feature_names = list(a.features) + [f"{c}={v}" for c in a.categorical for v in categories[c]]
    samples = MultimodalSamples(ids, images, torch.tensor(features, dtype=torch.float32).reshape(len(ids), width), y,
                                a.image_size, a.grayscale, masked)
    notes = {**label_notes(declared, unknown), "missing_policy": a.missing,
             "missing_modalities": {what: int(missing[what]) for what in [*a.images, *(["features"] if width else [])]}}
    return Pool(info, samples, labels=y, rows_read=len(records) + drops.counts["corrupt"], drops=drops,
                preprocess={"image_size": a.image_size, "grayscale": a.grayscale, "feature_names": feature_names,
                            "categories": categories, "missing": a.missing},
                notes=notes, groups=None if cfg.group_by is None else np.asarray(groups, dtype=object))
