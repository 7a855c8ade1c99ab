"""`hf_datasets`: data files read with Hugging Face `datasets` (parquet, arrow, json/jsonl, csv), or a dataset of
the hub by name.

    data: {source: hf_datasets, path: corpus/}                                   # LM: the "text" column
    data: {source: hf_datasets, path: reviews.parquet, args: {text_column: review, label_column: stars}}

`data.path` is a file or a folder (its files of one format, sorted). Without `label_column` the text column is a
language-modelling corpus, a row a document, tokenized once into token shards (data/formats/token_shards.py, a task
per file) like a `textfile` corpus. With it, the rows are text-classification records handled as `jsonl` handles its lines
(the same drops, labels, `classes` and tokenizers). Local files are streamed: nothing is copied to a cache.

A name that is no local path (`org/dataset`) is loaded from the Hugging Face cache, or from the hub when it is
reachable and HF_HUB_OFFLINE is not set (as for pretrained models, trainforge/hub.py); its cached arrow files are
then read like local ones.
"""
from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import Pool
from trainforge.confine import check_found, confined_roots
from trainforge.data.formats.token_shards import FileStat, HfFiles, hf_rows
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args, require_path
from trainforge.data.sources.jsonl import JsonlArgs, check_classification_tokenizer, records_pool
from trainforge.data.corpus.tokenize import TextCorpus
from trainforge.errors import UserError, quote
from trainforge.hub import first_line, why_not_hub

BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json", ".csv": "csv"}


class HfDatasetsArgs(SourceArgs):
    text_column: str = "text"
    label_column: Optional[str] = None  # set: text classification; unset: language modelling on text_column
    classes: Optional[list[Union[str, int]]] = None
    seq_len: int = Field(128, gt=0)  # classification: tokens per text
    block_size: int = Field(128, gt=0)  # language modelling: tokens per window
    split: str = "train"  # a hub dataset's split
    name: Optional[str] = None  # a hub dataset's configuration


@SOURCES.register("hf_datasets")
def hf_datasets(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: a parquet/arrow/json/jsonl/csv file or a folder of them, or a hub dataset name; args text_column
    ("text"), label_column (classification), classes, seq_len (128), block_size (128), split, name (hub)."""
    a = parse_args(HfDatasetsArgs, cfg)
    files, builder, origin = resolve_files(cfg, a)
    columns = first_columns(builder, files)
    wanted = [("data.args.text_column", a.text_column)] + ([("data.args.label_column", a.label_column)]
                                                          if a.label_column else [])
    for key, column in wanted:
        if columns is not None and column not in columns:
            raise UserError(f"{key}: {origin} has no column {column!r}; its columns: {', '.join(columns)}",
                            public=True)
    if a.label_column is None:
        if cfg.tokenizer == "bytes":
            raise UserError("data.tokenizer: bytes is for classification; a language-modelling corpus (no "
                            "data.args.label_column) takes raw_bytes, model or bpe", public=True)
        corpus = HfFiles(tuple(FileStat.of(f, "data.path") for f in files), builder, a.text_column, origin)
        info = DataInfo("lm", "text", (a.block_size,), "int64", 0, (), None, a.block_size)
        return Pool(info, TextCorpus(corpus, a.block_size), labels=None, rows_read=0,
                    preprocess={"seq_len": a.block_size}, notes={"corpus": origin})
    check_classification_tokenizer(cfg, "a classifier (data.args.label_column)")
    record_args = JsonlArgs(text_field=a.text_column, label_field=a.label_column, classes=a.classes, seq_len=a.seq_len)
    pool = records_pool(cfg, rows(builder, files), record_args)
    pool.notes = {**pool.notes, "corpus": origin}
    return pool


def rows(builder: str, files: list[Path]) -> Iterator[tuple[str, Optional[Any]]]:
    for f in files:
        for i, row in enumerate(hf_rows(builder, str(f)), start=1):
            yield f"{f.name} row {i}", row


def first_columns(builder: str, files: list[Path]) -> Optional[list[str]]:
    """The columns of the first row of the data, or None when it has no row."""
    for f in files:
        for row in islice(hf_rows(builder, str(f)), 1):
            return list(row)
    return None


def resolve_files(cfg: DataConfig, a: HfDatasetsArgs) -> tuple[list[Path], str, str]:
    """(files, datasets' builder, what to call the data): local files, or a hub dataset's cached arrow files."""
    what = "a parquet/arrow/json/jsonl/csv file, a folder of them, or a Hugging Face dataset name"
    if cfg.path and confined_roots() is None and not Path(cfg.path).expanduser().exists() and looks_like_name(cfg.path):
        return hub_files(cfg.path, a), "arrow", cfg.path
    path = require_path(cfg, what)
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in BUILDERS)
        check_found(files, path, "data.path")
    if not files:
        raise UserError(f"data.path: {path} has no {'/'.join(BUILDERS)} files; point it at {what}", public=True)
    builders = {BUILDERS.get(f.suffix.lower()) for f in files}
    if None in builders:
        raise UserError(f"data.path: {path} is not a {'/'.join(BUILDERS)} file; point it at {what}", public=True)
    if len(builders) > 1:
        raise UserError(f"data.path: {path} mixes formats ({', '.join(sorted(str(b) for b in builders))}); keep one "
                        "format in the folder", public=True)
    return files, builders.pop(), str(path)


def looks_like_name(text: str) -> bool:
    """A hub dataset id (`name` or `org/name`), not a path that does not exist."""
    parts = text.split("/")
    return len(parts) <= 2 and all(p and not p.startswith(".") and "\\" not in p for p in parts) \
        and Path(text).suffix.lower() not in BUILDERS


def hub_files(name: str, a: HfDatasetsArgs) -> list[Path]:
    """The arrow files of a hub dataset's split: from the Hugging Face cache, or downloaded into it when the hub may
    be asked."""
    # heavy (datasets, pyarrow: ~1 s) and only for a hub dataset
    import datasets

    why = why_not_hub()
    offline = datasets.config.HF_HUB_OFFLINE
    try:
        if why is not None:
            datasets.config.HF_HUB_OFFLINE = True  # the cache only: no retries against an unreachable hub
        ds = datasets.load_dataset(name, a.name, split=a.split)
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds for "not there"; each is the same to the user
        why = why or first_line(e)
        raise UserError(f"data.path: {quote(name)} is neither a local file or folder nor a dataset in the Hugging Face "
                        f"cache, and it could not be fetched ({why}); on a machine with network run "
                        f"`hf download --repo-type dataset {name}` and copy ~/.cache/huggingface here, or point "
                        "data.path at local files", public=True) from None
    finally:
        datasets.config.HF_HUB_OFFLINE = offline
    return [Path(f["filename"]) for f in ds.cache_files]
