"""`jsonl`: one JSON object per line with a text and a label, tokenized to bytes (see data/text.py), or,
with `data.tokenizer: model | bpe`, handed to the pipeline as texts (it tokenizes them after the split).

Lines that are not JSON objects or lack a string text are dropped as corrupt, empty/whitespace
texts as empty_text, missing labels or labels outside the declared `classes` as bad_label.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Optional, Union

import torch
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import DropLog, Pool, TensorSamples, TextSamples
from trainforge.data.sources.common import (
    SOURCES,
    SourceArgs,
    class_names_for,
    label_notes,
    label_text,
    parse_args,
    require_path,
)
from trainforge.data.text import BYTES_VOCAB_SIZE, PAD_ID, encode
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
    subword = cfg.tokenizer in ("model", "bpe")
    if cfg.tokenizer == "raw_bytes":
        raise UserError("data.tokenizer: raw_bytes is for language modelling (textfile); a jsonl classifier "
                        "takes bytes, model or bpe", public=True)
    path = require_path(cfg, "a JSONL file with one {text, label} object per line")
    if not path.is_file():
        raise UserError(f"data.path: {path} is a folder; point it at a JSONL file", public=True)
    declared = class_names_for([], a.classes) if a.classes else None
    drops, unknown = DropLog(), Counter[str]()
    tokens, labels, ids = [], [], []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue  # blank line: not a record
            ident = f"line {line_no}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict) or not isinstance(record.get(a.text_field), str):
                drops.drop("corrupt", ident)
                continue
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
            tokens.append(body if subword else encode(body, a.seq_len))
            labels.append(label)
            ids.append(ident)

    names = class_names_for(labels, declared)
    index = {name: i for i, name in enumerate(names)}
    y = torch.tensor([index[label] for label in labels], dtype=torch.int64)
    notes = label_notes(declared, unknown)
    if subword:  # vocabulary and padding are the tokenizer's: the pipeline completes info after the split
        info = DataInfo("classification", "text", (a.seq_len,), "int64", len(names), tuple(names), None, a.seq_len)
        return Pool(info, TextSamples(tokens, y, ids, a.seq_len), labels=y.numpy(), rows_read=len(ids) + drops.total,
                    drops=drops, preprocess={"seq_len": a.seq_len}, notes=notes)
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
    )
