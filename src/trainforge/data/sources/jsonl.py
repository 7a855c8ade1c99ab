"""`jsonl`: one JSON object per line with a text and a label, tokenized to bytes (see data/text/byte_level.py), or,
with `data.tokenizer: model | bpe`, handed to the pipeline as texts (it tokenizes them after the split).
A `.csv` or `.tsv` file with a header row is read the same way, a row a record (`text_field` and `label_field`
name its columns), so a spreadsheet export needs no conversion.

Lines that are not JSON objects or lack a string text are dropped as corrupt, empty/whitespace
texts as empty_text, missing labels or labels outside the declared `classes` as bad_label.
"""
from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

import numpy as np
import torch
from pydantic import Field

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
    label_text,
    no_group_column,
    parse_args,
    require_path,
)
from trainforge.data.text.byte_level import BYTES_VOCAB_SIZE, PAD_ID, encode
from trainforge.data.corpus.tokenize import TextSamples
from trainforge.errors import UserError


class JsonlArgs(SourceArgs):
    text_field: str = "text"
    label_field: str = "label"
    classes: Optional[list[Union[str, int]]] = None
    seq_len: int = Field(128, gt=0)


@SOURCES.register("jsonl")
def jsonl(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: a .jsonl file; args text_field, label_field, classes (optional), seq_len (128)."""
    a = parse_args(JsonlArgs, cfg)
    check_classification_tokenizer(cfg, "a jsonl classifier")
    path = require_path(cfg, "a JSONL file with one {text, label} object per line (or a CSV with a header)")
    if not path.is_file():
        raise UserError(f"data.path: {path} is a folder; point it at a JSONL or CSV file", public=True)
    no_text = None
    if path.suffix.lower() in DELIMITERS:
        no_text = (f"data.path: no row of {path} has a text in column {a.text_field!r}; name the text and label "
                   "columns with data.args.text_field and data.args.label_field")
    return records_pool(cfg, read_records(path, a), a, no_text=no_text)


def check_classification_tokenizer(cfg: DataConfig, what: str) -> None:
    if cfg.tokenizer == "raw_bytes":
        raise UserError(f"data.tokenizer: raw_bytes is for language modelling (textfile); {what} takes bytes, model "
                        "or bpe", public=True)


def records_pool(cfg: DataConfig, records: Iterable[tuple[str, Optional[Any]]], a: JsonlArgs, *,
                 no_text: Optional[str] = None) -> Pool:
    """Text-classification samples from (where, record) pairs (a record: a dict with a text and a label field, or
    None where a line is no record), byte-tokenized, or texts for the pipeline's subword tokenizer. `no_text`: the
    error when records were read but none had a text."""
    subword = cfg.tokenizer in ("model", "bpe")
    declared = class_names_for([], a.classes) if a.classes else None
    drops, unknown = DropLog(group_reasons(cfg, DROP_REASONS)), Counter[str]()
    tokens, labels, ids, groups = [], [], [], []
    column, seen_column, columns = cfg.group_by, False, set()
    for ident, record in records:
        if not isinstance(record, dict) or not isinstance(record.get(a.text_field), str):
            drops.drop("corrupt", ident)
            continue
        if column is not None:
            columns.update(record)
            seen_column |= column in record
        body = record[a.text_field]
        if not body.strip():
            drops.drop("empty_text", ident)
            continue
        label = label_text(record.get(a.label_field))
        if label is None or (declared is not None and label not in declared):
            drops.drop("bad_label", ident)
            if label is not None:
                unknown[label] += 1
            continue
        if column is not None:
            group = label_text(record.get(column))
            if group is None:
                drops.drop(MISSING_GROUP, ident)
                continue
            groups.append(group)
        tokens.append(body if subword else encode(body, a.seq_len))
        labels.append(label)
        ids.append(ident)

    if not ids and no_text is not None and drops.total:
        raise UserError(no_text, public=True)
    if column is not None and not seen_column:
        raise no_group_column(cfg, Path(str(cfg.path)).name, sorted(map(str, columns)))
    names = class_names_for(labels, declared)
    index = {name: i for i, name in enumerate(names)}
    y = torch.tensor([index[label] for label in labels], dtype=torch.int64)
    notes = label_notes(declared, unknown)
    if subword:  # vocabulary and padding are the tokenizer's: the pipeline completes info after the split
        info = DataInfo("classification", "text", (a.seq_len,), "int64", len(names), tuple(names), None, a.seq_len)
        return Pool(info, TextSamples(tokens, y, ids, a.seq_len), labels=y.numpy(), rows_read=len(ids) + drops.total,
                    drops=drops, preprocess={"seq_len": a.seq_len}, notes=notes, groups=_groups(column, groups))
    x = torch.tensor(tokens, dtype=torch.int64).reshape(len(tokens), a.seq_len)
    info = DataInfo(
        "classification", "text", (a.seq_len,), "int64", len(names), tuple(names), BYTES_VOCAB_SIZE, a.seq_len,
        pad_id=PAD_ID,
    )
    return Pool(
        info,
        TensorSamples(x, y, ids),
        labels=y.numpy(),
        rows_read=len(ids) + drops.total,
        drops=drops,
        preprocess={"tokenizer": "bytes", "seq_len": a.seq_len, "vocab_size": BYTES_VOCAB_SIZE},
        notes=notes,
        groups=_groups(column, groups),
    )


def _groups(column: Optional[str], groups: list[str]) -> Optional[np.ndarray]:
    return None if column is None else np.asarray(groups, dtype=object)


DELIMITERS = {".csv": ",", ".tsv": "\t"}


def read_records(path: Path, a: JsonlArgs) -> Iterator[tuple[str, Optional[Any]]]:
    """(where, record) for each record: a JSON object a line, or a CSV/TSV row under its header (None where a line
    is no record)."""
    delimiter = DELIMITERS.get(path.suffix.lower())
    with path.open(encoding="utf-8", errors="replace", newline="" if delimiter else None) as f:
        if delimiter is None:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue  # blank line: not a record
                try:
                    yield f"line {line_no}", json.loads(line)
                except json.JSONDecodeError:
                    yield f"line {line_no}", None
            return
        rows = csv.DictReader(f, delimiter=delimiter)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error:  # e.g. a field over csv's size limit: that row is corrupt, the next one is read
                yield f"line {rows.line_num}", None
                continue
            if None in row or any(v is None for v in row.values()):  # more or fewer cells than the header
                yield f"line {rows.line_num}", None
            else:
                yield f"line {rows.line_num}", row
