"""`csv`: a CSV file with a header; one label column, every other column a numeric feature.

Rows with the wrong number of fields are dropped as corrupt, rows whose label is empty or not in
the declared `classes` as bad_label; NaN/inf (and empty) features are left to the common cleaning
(nonfinite). A non-numeric feature column is a UserError naming the column. The `data.group_by` column (a patient
id) is no feature: it names each row's group, and a row where it is empty is dropped as missing_group.
"""
from __future__ import annotations

import csv
import math
from collections import Counter
from typing import Optional, Union

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import DROP_REASONS, DropLog, Pool, TensorSamples
from trainforge.data.sources.common import (
    MISSING_GROUP,
    SOURCES,
    SourceArgs,
    class_names_for,
    group_reasons,
    label_notes,
    no_group_column,
    parse_args,
    require_path,
)
from trainforge.errors import UserError, quote


class CsvArgs(SourceArgs):
    label_column: str = "label"
    classes: Optional[list[Union[str, int]]] = None


def _number(text: str) -> Optional[float]:
    """A feature value; empty means missing (NaN). None when the text is not a number."""
    text = text.strip()
    if not text:
        return math.nan
    try:
        return float(text)
    except ValueError:
        return None


@SOURCES.register("csv")
def csv_source(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: a CSV file; args label_column ("label"), classes (optional list of valid labels)."""
    a = parse_args(CsvArgs, cfg)
    path = require_path(cfg, "a CSV file with a header row")
    if not path.is_file():
        raise UserError(f"data.path: {path} is a folder; point it at a CSV file with a header row", public=True)
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise UserError(f"data.path: {path} is not a readable UTF-8 CSV file ({e})",
                        public=f"data.path: {path} is not a readable UTF-8 CSV file") from None
    if not rows:
        raise UserError(f"data.path: {path} is empty; it needs a header row and data rows", public=True)
    header = [h.strip() for h in rows[0]]
    if a.label_column not in header:
        raise UserError(
            f"data.args.label_column: column {a.label_column!r} is not in {path.name} "
            f"(columns: {', '.join(header)}); set it to the label column",
            public=f"data.args.label_column: column {quote(a.label_column)} is not in the CSV header; set it to the "
                   "label column",
        )
    label_at = header.index(a.label_column)
    group_at = None
    if cfg.group_by is not None:
        if cfg.group_by not in header or cfg.group_by == a.label_column:
            raise no_group_column(cfg, path.name, [h for h in header if h != a.label_column])
        group_at = header.index(cfg.group_by)
    feature_cols = [i for i in range(len(header)) if i not in (label_at, group_at)]
    if not feature_cols:
        raise UserError(f"data.path: {path.name} has no feature columns besides {a.label_column!r}", public=True)

    declared = class_names_for([], a.classes) if a.classes else None
    drops, unknown = DropLog(group_reasons(cfg, DROP_REASONS)), Counter[str]()
    features, labels, ids, groups = [], [], [], []
    for line, row in enumerate(rows[1:], start=2):  # line numbers as an editor shows them
        if not any(cell.strip() for cell in row):
            continue  # blank line: not a record
        ident = f"line {line}"
        if len(row) != len(header):
            drops.drop("corrupt", ident)
            continue
        label = row[label_at].strip()
        if not label or (declared is not None and label not in declared):
            drops.drop("bad_label", ident)
            if label:
                unknown[label] += 1
            continue
        if group_at is not None:
            group = row[group_at].strip()
            if not group:
                drops.drop(MISSING_GROUP, ident)
                continue
            groups.append(group)
        values = []
        for i in feature_cols:
            v = _number(row[i])
            if v is None:
                raise UserError(
                    f"data.path: column {header[i]!r} of {path.name} is not numeric ({ident}: {quote(row[i])}); "
                    "encode it as numbers or remove the column",
                    public=f"data.path: a feature column of {path.name} is not numeric; encode it as numbers or "
                           "remove the column",
                )
            values.append(v)
        features.append(values)
        labels.append(label)
        ids.append(ident)

    names = class_names_for(labels, declared)
    index = {name: i for i, name in enumerate(names)}
    y = torch.tensor([index[label] for label in labels], dtype=torch.int64)
    x = torch.tensor(features, dtype=torch.float32).reshape(len(features), len(feature_cols))
    info = DataInfo("classification", "tabular", (len(feature_cols),), "float32", len(names), tuple(names))
    return Pool(
        info,
        TensorSamples(x, y, ids),
        labels=y.numpy(),
        rows_read=len(ids) + drops.total,
        drops=drops,
        preprocess={"num_features": len(feature_cols), "feature_names": [header[i] for i in feature_cols]},
        notes=label_notes(declared, unknown),
        groups=None if group_at is None else np.asarray(groups, dtype=object),
    )
