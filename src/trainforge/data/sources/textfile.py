"""`textfile`: a language-modelling corpus of text files, tokenized once into memory-mapped token shards.

The files (sorted, cut at max_bytes) are tokenized into one stream (raw bytes: id = byte value, vocab 256,
tokenizer "raw_bytes" in data/text/byte_level.py; or data.tokenizer model | bpe, each file followed by the eos id) by
data/formats/token_shards.py, once per corpus and tokenizer, and read as non-overlapping windows: window k is
tokens[k*(B+1) : (k+1)*(B+1)] with B = block_size; x = w[:-1], y = w[1:]. The pipeline splits windows into
contiguous train/val/test ranges, so no val/test text is trained on.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import Pool
from trainforge.confine import check_found
from trainforge.data.formats.token_shards import TextFiles
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args, require_path
from trainforge.data.corpus.tokenize import TextCorpus
from trainforge.errors import UserError

TEXT_SUFFIXES = (".txt", ".md", ".py")
STDLIB_MAX_BYTES = 2_000_000


class TextFileArgs(SourceArgs):
    block_size: int = Field(128, gt=0)
    corpus: Optional[Literal["python_stdlib"]] = None
    max_bytes: Optional[int] = Field(None, gt=0)  # default: all of data.path; 2_000_000 for python_stdlib


def corpus_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    if not files:
        raise UserError(
            f"data.path: {path} has no {'/'.join(TEXT_SUFFIXES)} files; point it at a text file or such a folder",
            public=True,
        )
    check_found(files, path, "data.path")
    return files


def stdlib_files() -> list[Path]:
    """Top-level .py files of the running Python's standard library, sorted: local and deterministic."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


@SOURCES.register("textfile")
def textfile(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: a text file or folder (*.txt, *.md, *.py, sorted), or data.args.corpus=python_stdlib
    with data.path unset; args block_size (128), max_bytes."""
    a = parse_args(TextFileArgs, cfg)
    if a.corpus is not None and cfg.path:
        raise UserError("data.args.corpus: set either data.path or data.args.corpus=python_stdlib, not both", public=True)
    if a.corpus == "python_stdlib":
        corpus = TextFiles.of(stdlib_files(), a.max_bytes or STDLIB_MAX_BYTES, "python_stdlib")
    else:
        path = require_path(
            cfg, "a text file or a folder of .txt/.md/.py files (or set data.args.corpus=python_stdlib)"
        )
        corpus = TextFiles.of(corpus_files(path), a.max_bytes, str(path))
    if cfg.tokenizer == "bytes":
        raise UserError("data.tokenizer: bytes is for classification (jsonl); a textfile corpus takes raw_bytes, "
                        "model or bpe", public=True)
    info = DataInfo("lm", "text", (a.block_size,), "int64", 0, (), None, a.block_size)
    return Pool(info, TextCorpus(corpus, a.block_size), labels=None, rows_read=0,
                preprocess={"seq_len": a.block_size}, notes={"corpus": corpus.origin})
