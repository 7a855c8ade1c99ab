"""`textfile`: a byte-level language-modelling corpus cut into non-overlapping windows.

Window k is bytes[k*(B+1) : (k+1)*(B+1)] with B = block_size; x = w[:-1], y = w[1:], ids are the
byte values (vocab 256, tokenizer "raw_bytes" in data/text.py). The pipeline splits windows into
contiguous train/val/test ranges, so no val/test text is trained on.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Literal, Optional

import torch
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import Pool, TextCorpus
from trainforge.data.roots import check_found
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args, require_path
from trainforge.data.text import RAW_BYTES_VOCAB_SIZE
from trainforge.errors import UserError

TEXT_SUFFIXES = (".txt", ".md", ".py")
STDLIB_MAX_BYTES = 2_000_000


class TextFileArgs(SourceArgs):
    block_size: int = Field(128, gt=0)
    corpus: Optional[Literal["python_stdlib"]] = None
    max_bytes: Optional[int] = Field(None, gt=0)  # default: all of data.path; 2_000_000 for python_stdlib


class ByteWindows:
    """Windows of block_size + 1 over a 1-D tensor of ids (bytes, or a subword tokenizer's ids)."""

    def __init__(self, data: torch.Tensor, block_size: int) -> None:
        self.data, self.block_size = data, block_size

    def __len__(self) -> int:
        return len(self.data) // (self.block_size + 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        n = self.block_size + 1
        w = self.data[index * n : (index + 1) * n].long()
        return w[:-1], w[1:]


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


def read_corpus(files: list[Path], max_bytes: Optional[int]) -> tuple[bytes, int]:
    """The files' bytes concatenated in order, cut at max_bytes; and how many files were read."""
    chunks, size = [], 0
    for f in files:
        if max_bytes is not None and size >= max_bytes:
            break
        data = f.read_bytes()
        chunks.append(data)
        size += len(data)
    corpus = b"".join(chunks)
    return (corpus if max_bytes is None else corpus[:max_bytes]), len(chunks)


@SOURCES.register("textfile")
def textfile(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: a text file or folder (*.txt, *.md, *.py, sorted), or data.args.corpus=python_stdlib
    with data.path unset; args block_size (128), max_bytes."""
    a = parse_args(TextFileArgs, cfg)
    if a.corpus is not None and cfg.path:
        raise UserError("data.args.corpus: set either data.path or data.args.corpus=python_stdlib, not both", public=True)
    if a.corpus == "python_stdlib":
        files = stdlib_files()
        corpus, files_read = read_corpus(files, a.max_bytes or STDLIB_MAX_BYTES)
        origin = "python_stdlib"
    else:
        path = require_path(
            cfg, "a text file or a folder of .txt/.md/.py files (or set data.args.corpus=python_stdlib)"
        )
        files = corpus_files(path)
        corpus, files_read = read_corpus(files, a.max_bytes)
        origin = str(path)
    notes = {"corpus": origin, "corpus_files": files_read, "corpus_bytes": len(corpus)}
    if cfg.tokenizer in ("model", "bpe"):  # the pipeline tokenizes the documents and cuts the windows
        documents = corpus_documents(files, corpus)
        info = DataInfo("lm", "text", (a.block_size,), "int64", 0, (), None, a.block_size)
        return Pool(info, TextCorpus(documents, a.block_size), labels=None, rows_read=len(documents),
                    preprocess={"seq_len": a.block_size}, notes=notes)
    if cfg.tokenizer == "bytes":
        raise UserError("data.tokenizer: bytes is for classification (jsonl); a textfile corpus takes raw_bytes, "
                        "model or bpe", public=True)
    windows = ByteWindows(torch.frombuffer(bytearray(corpus), dtype=torch.uint8), a.block_size)
    if len(windows) == 0:
        raise UserError(
            f"data.path: the corpus has {len(corpus)} bytes, less than one window of "
            f"data.args.block_size + 1 = {a.block_size + 1}; lower data.args.block_size or add text",
            public=True,
        )
    vocab = RAW_BYTES_VOCAB_SIZE
    info = DataInfo("lm", "text", (a.block_size,), "int64", vocab, (), vocab, a.block_size)
    return Pool(
        info,
        windows,
        labels=None,
        rows_read=len(windows),
        preprocess={"tokenizer": "raw_bytes", "vocab_size": RAW_BYTES_VOCAB_SIZE, "seq_len": a.block_size},
        notes=notes,
    )


def corpus_documents(files: list[Path], corpus: bytes) -> list[str]:
    """The corpus as text, one document per file read (cut where max_bytes cut the corpus)."""
    documents, offset = [], 0
    for f in files:
        if offset >= len(corpus):
            break
        size = f.stat().st_size
        documents.append(corpus[offset : offset + size].decode("utf-8", errors="replace"))
        offset += size
    return documents
