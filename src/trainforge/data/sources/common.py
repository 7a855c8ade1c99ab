"""What every data source shares: the registry, argument parsing, path and label helpers.

A source is one registered function `source(cfg: DataConfig, *, seed: int) -> Pool`
(`custom` may also return a finished DataBundle). Its `data.args` are declared as a `SourceArgs`
model, so unknown keys and wrong types become one-line UserErrors naming `data.args.<key>`.
"""
from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from trainforge.config import DataConfig
from trainforge.data.base import DataBundle
from trainforge.data.pool import Pool
from trainforge.confine import confine, confined_roots
from trainforge.errors import UserError, quote
from trainforge.registry import Registry

Source = Callable[..., Union[Pool, DataBundle]]
SOURCES: Registry[Source] = Registry("data source", "data.source")

A = TypeVar("A", bound="SourceArgs")


class SourceArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


def parse_args(model: type[A], cfg: DataConfig) -> A:
    """Validate `cfg.args` against a source's argument model; errors name `data.args.<key>`."""
    try:
        return model.model_validate(cfg.args)
    except ValidationError as err:
        e = err.errors()[0]
        key = "data.args." + ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            valid = ", ".join(model.model_fields) or "(none)"
            raise UserError(f"{key}: unknown argument for data source {cfg.source!r}; valid: {valid}", public=True) from None
        if e["type"] == "missing":
            raise UserError(f"{key}: required by data source {cfg.source!r}; set it in data.args", public=True) from None
        msg = e["msg"].removeprefix("Value error, ")
        raise UserError(f"{key}: {msg[:1].lower() + msg[1:]}, got {quote(e.get('input'))}", public=True) from None


def require_path(cfg: DataConfig, what: str) -> Path:
    """`data.path` as an existing Path, or a UserError saying what it should point at."""
    if not cfg.path:
        raise UserError(f"data.path: required for data source {cfg.source!r}; point it at {what}", public=True)
    roots = confined_roots()
    path = Path(cfg.path).expanduser() if roots is None else confine(cfg.path, "data.path", roots)
    if not path.exists():
        raise UserError(f"data.path: {path} does not exist; point it at {what}", public=True)
    return path


def class_names_for(labels: list[str], declared: Optional[list[Any]]) -> list[str]:
    """Class names in index order: the declared list, else the labels sorted (numerically if all ints)."""
    if declared:
        names = [str(c) for c in declared]
        if len(set(names)) != len(names):
            raise UserError(f"data.args.classes: has duplicate entries {quote(names)}; list each class once", public=True)
        return names
    unique = set(labels)
    if all(_is_int(s) for s in unique):
        return sorted(unique, key=int)
    return sorted(unique)


INDEX_SUFFIXES = (".csv", ".jsonl", ".parquet")  # an index: a row per sample, its files by path relative to it


def read_index(path: Path) -> Iterator[tuple[str, Optional[dict[str, Any]]]]:
    """(where, record) per row of an index (.csv with a header, .jsonl, .parquet); None where a row is no record
    (a CSV row of more or fewer cells than the header, a line that is not a JSON object)."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # datasets' dependency

        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield f"row {i}", row
        return
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        if suffix == ".csv":
            rows = csv.DictReader(f)
            for row in rows:
                ok = None not in row and all(v is not None for v in row.values())
                yield f"line {rows.line_num}", ({k: v.strip() for k, v in row.items()} if ok else None)
            return
        for n, line in enumerate(f, start=1):
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    record = None
                yield f"line {n}", record if isinstance(record, dict) else None


def under_index(index: Path, rel: str, where: str) -> Path:
    """`rel` (a path in an index) resolved against the index's folder; one that leaves the folder (`..`, an absolute
    path, a link pointing out) is a UserError: an index names files below it, nothing else."""
    base = index.parent.resolve()
    target = (base / rel).resolve()
    if not target.is_relative_to(base):
        raise UserError(f"data.path: {index.name} {where}: {quote(rel)} is outside the index's folder; paths in an "
                        "index are relative to it and stay below it", public=True)
    return target


MISSING_GROUP = "missing_group"  # the drop reason of a sample whose data.group_by column is empty


def group_reasons(cfg: DataConfig, reasons: tuple[str, ...]) -> tuple[str, ...]:
    """A source's drop reasons, with missing_group when the data is grouped (data.group_by)."""
    return reasons + (MISSING_GROUP,) if cfg.group_by is not None else reasons


def no_group_column(cfg: DataConfig, where: str, columns: list[str]) -> UserError:
    """data.group_by names a column no record of `where` has."""
    listed = ", ".join(columns[:20]) or "(none)"
    return UserError(f"data.group_by: {where} has no column {quote(cfg.group_by)} (columns: {listed}); set it to "
                     "the column that names each sample's group, e.g. patient_id", public=True)


MAX_UNKNOWN_LABELS = 10  # labels outside the declared classes named in the data report (most frequent first)


def label_notes(declared: Optional[list[str]], unknown: Counter[str]) -> dict[str, Any]:
    """Data-report facts about labels: whether `classes` was declared, and which labels it left out."""
    notes: dict[str, Any] = {"classes_declared": declared is not None}
    if declared is not None:
        notes["labels_not_in_classes"] = dict(unknown.most_common(MAX_UNKNOWN_LABELS))
    return notes


def label_text(value: Any) -> Optional[str]:
    """A label as a string, or None when it cannot be one (missing, bool, list, empty ...)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, str)) or (isinstance(value, float) and value.is_integer()):
        text = str(int(value)) if isinstance(value, float) else str(value).strip()
        return text or None
    return None


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True
