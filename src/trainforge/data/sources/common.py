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
PARQUET_BATCH_ROWS = 65536


def read_index(path: Path, cfg: Optional[DataConfig] = None) -> Iterator[tuple[str, Optional[dict[str, Any]]]]:
    """(where, record) per row of an index (.csv with a header, .jsonl, .parquet); None where a row is no record
    (a CSV row of more or fewer cells than the header, a line that is not a JSON object, a value beyond the field
    bound). Read in batches within `cfg`'s data.max_index_rows and data.max_field_bytes: an index of more rows is one
    line naming the setting; any failure of the file as a whole is one line naming it."""
    max_rows = cfg.max_index_rows if cfg is not None else DataConfig().max_index_rows
    max_field = cfg.max_field_bytes if cfg is not None else DataConfig().max_field_bytes
    try:
        yield from _index_rows(path, path.suffix.lower(), max_rows, max_field)
    except UserError:
        raise
    except Exception as e:  # pyarrow, csv, the file system: whatever the failure, one line naming the file
        raise UserError(f"data.path: {path.name} cannot be read as an index ({type(e).__name__}: "
                        f"{quote(str(e)[:200])}); write it as .csv with a header, .jsonl or .parquet", public=True) \
            from None


def _too_many(path: Path, max_rows: int) -> UserError:
    return UserError(f"data.path: {path.name} has more than {max_rows:,} rows (data.max_index_rows); raise "
                     "data.max_index_rows if it really holds that many samples", public=True)


def _index_rows(path: Path, suffix: str, max_rows: int, max_field: int) -> Iterator[tuple[str, Optional[dict]]]:
    if suffix == ".parquet":
        import pyarrow.parquet as pq  # datasets' dependency

        table = pq.ParquetFile(path)
        if table.metadata.num_rows > max_rows:  # the footer says: nothing is decoded yet
            raise _too_many(path, max_rows)
        i = 0
        for batch in table.iter_batches(batch_size=PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                i += 1
                fits = all(not isinstance(v, (str, bytes)) or len(v) <= max_field for v in row.values())
                yield f"row {i}", row if fits else None
        return
    csv.field_size_limit(max_field)
    with path.open(encoding="utf-8", errors="replace", newline="") as f:
        if suffix == ".csv":
            rows = csv.DictReader(f)
            n = 0
            while True:
                try:
                    row = next(rows)
                except StopIteration:
                    return
                except csv.Error:  # a field beyond the bound, a NUL: that line is no record
                    yield f"line {rows.line_num}", None
                    continue
                n += 1
                if n > max_rows:
                    raise _too_many(path, max_rows)
                ok = None not in row and all(v is not None for v in row.values())
                yield f"line {rows.line_num}", ({k: v.strip() for k, v in row.items()} if ok else None)
        n = 0
        for number, line in enumerate(_bounded_lines(f, max_field), start=1):
            if line is not None and not line.strip():
                continue
            n += 1
            if n > max_rows:
                raise _too_many(path, max_rows)
            try:
                record = json.loads(line) if line is not None else None
            except (ValueError, RecursionError):  # not JSON, an integer beyond Python's digit limit, nested too deep
                record = None
            yield f"line {number}", record if isinstance(record, dict) else None


def _bounded_lines(f: Any, max_chars: int) -> Iterator[Optional[str]]:
    """The file's lines; None for a line longer than `max_chars` (read past in pieces, never held whole)."""
    while True:
        line = f.readline(max_chars + 1)
        if not line:
            return
        if len(line) > max_chars and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = f.readline(max_chars + 1)
            yield None
            continue
        yield line


def under_index(index: Path, rel: str, where: str) -> Path:
    """`rel` (a path in an index) resolved against the index's folder; one that leaves the folder (`..`, an absolute
    path, a link pointing out) is a UserError: an index names files below it, nothing else."""
    base = index.parent.resolve()
    if "\x00" in rel or len(rel) > MAX_PATH_CHARS or any(len(part.encode(errors="surrogateescape")) > 255
                                                          for part in rel.split("/")):
        raise UserError(f"data.path: {index.name} {where}: {quote(rel[:80])} is not a path (a NUL byte, a name over "
                        f"255 bytes, or over {MAX_PATH_CHARS} characters); name a file below the index's folder",
                        public=True)
    target = (base / rel).resolve()
    if not target.is_relative_to(base):
        raise UserError(f"data.path: {index.name} {where}: {quote(rel)} is outside the index's folder; paths in an "
                        "index are relative to it and stay below it", public=True)
    return target


MAX_PATH_CHARS = 4096  # PATH_MAX: a longer name is no file on Linux


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
