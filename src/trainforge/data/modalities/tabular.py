"""Tabular rows: (F,) float32 features, normalized per feature."""
from __future__ import annotations

import csv
import io
import math
from typing import Any, BinaryIO, Iterator, Optional, Sequence

import numpy as np

from trainforge.data.modalities.base import Modality, Reader, Sample, register_modality
from trainforge.data.modalities.inputs import display_name, input_shape, normalization, normalize, read_bytes, require_files
from trainforge.errors import UserError


@register_modality
class Tabular(Modality):
    name = "tabular"
    description = "feature vectors (F,): normalized per feature; no augmentation"
    scaled = True
    model_preprocessing = "refuse"
    served = "CSV files with a header row, or - for standard input"

    def reader(self, meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
        """CSV files or '-' -> float32 (F,) per row: the stored feature columns by name, normalized per feature."""
        pre = meta.get("preprocess", {})
        (num_features,) = input_shape(meta, 1, artifact)
        names = pre.get("feature_names")
        if names is not None and len(names) != num_features:
            raise UserError(f"{artifact}: {len(names)} feature names for {num_features} features in its metadata; re-export it")
        shift_scale = normalization(pre.get("normalize"), num_features, self.channel_view, artifact)

        def read(inputs: Sequence[str]) -> Iterator[Sample]:
            require_files(inputs, "CSV files with a header row", allow_stdin=True)
            for source in inputs:
                for name, values in csv_rows(source, read_bytes(source, stdin), names, num_features):
                    # float32 first, as torch.tensor(features, dtype=float32) stored the training rows
                    yield name, normalize(np.asarray(values, dtype=np.float32), shift_scale)

        return read


def feature_value(cell: str) -> Optional[float]:
    """A finite number, or None (empty, not a number, NaN or infinite: training dropped such rows)."""
    try:
        value = float(cell.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def csv_rows(source: str, data: bytes, feature_names: Optional[list[str]], num_features: int) -> Iterator[tuple[str, list[float]]]:
    """(source:line, the feature values in the model's order) of each data row of one CSV text."""
    shown = display_name(source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"INPUT: {shown} is not UTF-8 text; save the CSV as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise UserError(f"INPUT: {shown} is empty; it needs a header row naming the feature columns")
        if feature_names is None:  # a custom source without names: every column is a feature, in order
            if len(header) != num_features:
                raise UserError(f"INPUT: {shown} has {len(header)} columns; the model takes exactly {num_features} features")
            columns = list(range(num_features))
        else:
            missing = [f for f in feature_names if f not in header]
            if missing:
                raise UserError(
                    f"INPUT: {shown} lacks column(s) {', '.join(map(repr, missing))}; the model needs "
                    f"{', '.join(feature_names)} (extra columns are ignored)"
                )
            columns = [header.index(f) for f in feature_names]
        row_no = 0
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # a blank line is not a record (as in training)
            row_no += 1
            where = f"INPUT: {shown} row {row_no} (line {reader.line_num})"
            if len(row) != len(header):
                raise UserError(f"{where}: {len(row)} fields, the header has {len(header)}; fix that row")
            values = []
            for i in columns:
                value = feature_value(row[i])
                if value is None:
                    raise UserError(f"{where}, column {header[i]!r}: {row[i]!r} is not a finite number; write a number there")
                values.append(value)
            yield f"{shown}:{reader.line_num}", values
    except csv.Error as e:
        raise UserError(f"INPUT: {shown} line {reader.line_num} is not valid CSV ({e})") from None
