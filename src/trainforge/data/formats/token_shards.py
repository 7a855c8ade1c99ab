"""Token shards: a language-modelling corpus tokenized once into memory-mapped arrays that every run reads.

    corpus = TextFiles(files, max_bytes=None, origin="/data/books")    # or HfFiles(files, "parquet", "text", ...)
    index = prepare_shards(corpus, RawBytes())                          # tokenizes (once, in parallel) or reuses
    index = prepare_shards(corpus, Subword.of(tok))                     # a TextTokenizer (model | bpe)
                                                                        # (both of data/text/codec.py)
    shards = TokenShards(index)
    ids = shards.read(start, stop)                                      # int64 tokens [start, stop) of the stream

Layout: `$TRAINFORGE_HOME/tokens/<key>/` (home default `~/.cache/trainforge`) holds `index.json` (shards, token
counts, dtype, tokenizer identity), `files.json` (the corpus files with size and mtime), `tokenizer.json` (a
subword tokenizer's own file) and `shard-00000.bin`, ... (raw arrays of uint8 for byte tokens, uint16 for a vocabulary
up to 65,536, else uint32; the tokens of the files in order, each document followed by the tokenizer's eos id).
The key is a SHA-256 of the corpus (resolved paths, sizes, mtimes, max_bytes, column) and the tokenizer (its
tokenizer.json and eos id, or raw bytes): a changed file or another tokenizer gets its own directory.

Preparing is done once per key, whoever asks first (`trainforge data prepare`, a train run, each rank of one, a
plan, a tune trial): the others wait on a file lock beside the directory. Shards are written to a temporary
directory, then renamed into place, so a crash mid-prepare leaves nothing a later run trusts (the next one
clears it and starts again). The corpus is cut into tasks of about SHARD_BYTES (files grouped, a large file
cut at line ends), one shard each, tokenized by a process pool.

Reading `pread`s each window's bytes (nothing is memory-mapped), so a rank's resident memory does not grow with
the corpus or with how much of it an epoch has read; the file pages stay in the page cache, shared by every
process of the machine. Torch-free: the pool's workers import only
this module, the tokenizers of data/text (`codec`, `tokenizer`), numpy and `tokenizers` (`datasets` for an
`hf_datasets` corpus).
"""
from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from bisect import bisect_right
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence

import numpy as np

from trainforge.confine import check_read
from trainforge.data.text.codec import ShardTokenizer, Subword
from trainforge.data.text.tokenizer import TOKENIZER_FILE, TextTokenizer, is_stored
from trainforge.errors import UserError
from trainforge.files import (file_lock, fsync_dir, fsync_file, shared_homes, trainforge_home, write_json_atomic,
                              write_text_atomic)
from trainforge.hardware.cpus import available_cpus

FORMAT = 1  # of index.json and the shard files; another format is another key
SHARD_BYTES = 256 * 2**20  # corpus bytes per shard (and per task of the pool)
PIECE_BYTES = 2**20  # corpus bytes a worker reads and tokenizes at a time: its memory stays small
CUT_SEARCH_BYTES = 2**16  # a large file is cut at the first line end this close after the shard boundary
BPE_TRAIN_MAX_BYTES = 2**30  # data.tokenizer: bpe learns its merges from at most this much of the train text
PROGRESS_EVERY_S = 5.0
Progress = Callable[[str], None]


TOKEN_DTYPES = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32))  # what token_dtype chooses from


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer that holds every id of the vocabulary."""
    for dtype in TOKEN_DTYPES:
        if vocab_size <= np.iinfo(dtype).max + 1:
            return dtype
    raise UserError(f"data.tokenizer: a vocabulary of {vocab_size:,} ids does not fit token shards (at most 2**32)")


def tokens_home() -> Path:
    return trainforge_home() / "tokens"


# ---- corpora: what to tokenize, cut into tasks of about SHARD_BYTES


class Task(Protocol):
    separator: bytes

    @property
    def size_bytes(self) -> int: ...

    def pieces(self) -> Iterator[tuple[bytes, bool]]:
        """(bytes, whether a document ends with them), in order."""
        ...


@dataclass(frozen=True)
class Segment:
    path: str
    start: int
    end: int
    doc_end: bool  # the segment ends its file (or the corpus' max_bytes)


@dataclass(frozen=True)
class TextTask:
    segments: tuple[Segment, ...]
    separator: bytes = b""

    @property
    def size_bytes(self) -> int:
        return sum(s.end - s.start for s in self.segments)

    def pieces(self) -> Iterator[tuple[bytes, bool]]:
        for seg in self.segments:
            if seg.start == seg.end:
                yield b"", seg.doc_end
                continue
            with open(seg.path, "rb") as f:
                f.seek(seg.start)
                left = seg.end - seg.start
                while left > 0:
                    data = f.read(min(PIECE_BYTES, left))
                    if not data:
                        raise UserError(f"data.path: {seg.path} got shorter while it was tokenized; run again once "
                                        "the corpus stops changing", public=True)
                    left -= len(data)
                    cut = data.rfind(b"\n") + 1  # the next piece starts a line: a subword is never cut in two
                    if left > 0 and 0 < cut < len(data):
                        f.seek(cut - len(data), os.SEEK_CUR)
                        left += len(data) - cut
                        data = data[:cut]
                    yield data, left == 0 and seg.doc_end


@dataclass(frozen=True)
class FileStat:
    path: str
    size_bytes: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, field_name: str) -> "FileStat":
        try:
            st = path.stat()
        except OSError as e:
            raise UserError(f"{field_name}: cannot read {path} ({e.strerror}); check the file", public=True) from None
        return cls(str(path.resolve()), st.st_size, st.st_mtime_ns)


class Corpus(Protocol):
    origin: str
    stats: tuple[FileStat, ...]

    def identity(self) -> dict[str, Any]: ...

    def tasks(self, shard_bytes: int) -> list[Task]: ...

    def train_texts(self, share: float) -> Iterator[str]: ...

    def files_read(self) -> int: ...


@dataclass(frozen=True)
class TextFiles:
    """The bytes of text files, concatenated in order and cut at max_bytes; one document per file."""

    stats: tuple[FileStat, ...]
    max_bytes: Optional[int]
    origin: str

    @classmethod
    def of(cls, files: Sequence[Path], max_bytes: Optional[int], origin: str) -> "TextFiles":
        return cls(tuple(FileStat.of(f, "data.path") for f in files), max_bytes, origin)

    def identity(self) -> dict[str, Any]:
        return {"kind": "text_files", "max_bytes": self.max_bytes}

    def documents(self) -> Iterator[tuple[FileStat, int]]:
        """(file, bytes of it read): up to max_bytes in all."""
        budget = self.max_bytes if self.max_bytes is not None else float("inf")
        for st in self.stats:
            if budget <= 0:
                return
            size = int(min(st.size_bytes, budget))
            yield st, size
            budget -= size

    def tasks(self, shard_bytes: int) -> list[Task]:
        tasks: list[Task] = []
        current: list[Segment] = []
        room = shard_bytes
        for st, size in self.documents():
            if size == 0:
                current.append(Segment(st.path, 0, 0, True))
            start = 0
            while start < size:
                end = start + min(size - start, room)
                if end < size:
                    end = cut_point(st.path, end, size)
                current.append(Segment(st.path, start, end, end == size))
                room -= end - start
                start = end
                if room <= 0:
                    tasks.append(TextTask(tuple(current)))
                    current, room = [], shard_bytes
        if current:
            tasks.append(TextTask(tuple(current)))
        return tasks

    def train_texts(self, share: float) -> Iterator[str]:
        return leading_text(self.tasks(SHARD_BYTES), share)

    def files_read(self) -> int:
        return sum(1 for _ in self.documents())


def leading_text(tasks: Sequence[Task], share: float) -> Iterator[str]:
    """The leading `share` of the corpus' bytes as text, at most BPE_TRAIN_MAX_BYTES: text the contiguous split
    trains on, where a BPE learns its merges. The total is counted first (up to where the cap decides)."""
    total = 0
    for data, _ in (piece for task in tasks for piece in task.pieces()):
        total += len(data)
        if total * share >= BPE_TRAIN_MAX_BYTES:
            break
    budget = min(int(total * share), BPE_TRAIN_MAX_BYTES)
    for task in tasks:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for data, doc_end in task.pieces():
            if budget <= 0:
                return
            data = data[:budget]
            budget -= len(data)
            yield decoder.decode(data, final=doc_end or budget <= 0)
            if doc_end:
                decoder.reset()


def cut_point(path: str, end: int, size: int) -> int:
    """Where to cut a file near byte `end`: after the first line end within CUT_SEARCH_BYTES, else at the first
    character boundary (UTF-8 never cut inside a character)."""
    with open(path, "rb") as f:
        f.seek(end)
        ahead = f.read(min(CUT_SEARCH_BYTES, size - end))
    newline = ahead.find(b"\n")
    if newline >= 0:
        return end + newline + 1
    i = 0
    while i < len(ahead) and i < 4 and (ahead[i] & 0xC0) == 0x80:  # a UTF-8 continuation byte
        i += 1
    return end + i


def hf_rows(builder: str, path: str) -> Iterator[dict[str, Any]]:
    """The rows of one local data file (parquet, arrow, json, csv), streamed: nothing is copied to a cache."""
    # heavy (datasets, pyarrow: ~1 s) and only for data.source: hf_datasets
    from datasets import load_dataset

    return iter(load_dataset(builder, data_files=[path], split="train", streaming=True))


@dataclass(frozen=True)
class HfTask:
    """One data file's text column, a row a document (rows of raw bytes end with a line end)."""

    path: str
    builder: str
    column: str
    size_bytes: int
    separator: bytes = b"\n"

    def pieces(self) -> Iterator[tuple[bytes, bool]]:
        for row in hf_rows(self.builder, self.path):
            text = row.get(self.column)
            if isinstance(text, str) and text.strip():
                yield text.encode("utf-8"), True


@dataclass(frozen=True)
class HfFiles:
    """The text column of data files read with Hugging Face `datasets` (`builder`: parquet, arrow, json, csv);
    a task per file, so the pool tokenizes files in parallel."""

    stats: tuple[FileStat, ...]
    builder: str
    column: str
    origin: str

    def identity(self) -> dict[str, Any]:
        return {"kind": "hf_datasets", "builder": self.builder, "column": self.column}

    def tasks(self, shard_bytes: int) -> list[Task]:
        return [HfTask(s.path, self.builder, self.column, s.size_bytes) for s in self.stats]

    def train_texts(self, share: float) -> Iterator[str]:
        return leading_text(self.tasks(SHARD_BYTES), share)

    def files_read(self) -> int:
        return len(self.stats)


# ---- the index of a prepared directory


@dataclass
class ShardIndex:
    directory: Path
    dtype: str
    shard_files: list[str]
    shard_tokens: list[int]
    corpus_bytes: int
    corpus_files: int
    documents: int
    tokenizer: dict[str, Any]
    prepared_s: float
    reused: bool = False  # found ready, not tokenized by this call

    @property
    def tokens(self) -> int:
        return sum(self.shard_tokens)

    @property
    def shard_bytes(self) -> int:
        return self.tokens * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "dtype": self.dtype, "tokens": self.tokens,
                "shards": [{"file": f, "tokens": n} for f, n in zip(self.shard_files, self.shard_tokens)],
                "corpus_bytes": self.corpus_bytes, "corpus_files": self.corpus_files, "documents": self.documents,
                "tokenizer": self.tokenizer, "prepared_s": self.prepared_s}

    def summary(self) -> dict[str, Any]:
        """What a run's data report and `trainforge data prepare --json` say about the shards."""
        return {"directory": str(self.directory), "shards": len(self.shard_files), "tokens": self.tokens,
                "dtype": self.dtype, "bytes": self.shard_bytes, "corpus_bytes": self.corpus_bytes,
                "corpus_files": self.corpus_files, "reused": self.reused, "prepared_s": round(self.prepared_s, 3)}


INDEX_FILE = "index.json"


def read_index(directory: Path) -> Optional[ShardIndex]:
    """The index of a complete shard directory, or None (absent, another format, a shard of the wrong size)."""
    try:
        doc = json.loads((directory / INDEX_FILE).read_text())
        if doc.get("format") != FORMAT:
            return None
        index = ShardIndex(directory, str(doc["dtype"]), [s["file"] for s in doc["shards"]],
                           [int(s["tokens"]) for s in doc["shards"]], int(doc["corpus_bytes"]),
                           int(doc["corpus_files"]), int(doc["documents"]), dict(doc["tokenizer"]),
                           float(doc["prepared_s"]), reused=True)
        if np.dtype(index.dtype) not in TOKEN_DTYPES:  # only what token_dtype writes: never objects, never floats
            return None
        if any(not isinstance(name, str) or Path(name).name != name or name in ("", ".", "..")
               for name in index.shard_files):  # files of this directory, as write_shards names them
            return None
        itemsize = np.dtype(index.dtype).itemsize
        for name, n in zip(index.shard_files, index.shard_tokens):
            if (directory / name).stat().st_size != n * itemsize:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return index


def shard_key(corpus: Corpus, tok: ShardTokenizer) -> str:
    doc = {"format": FORMAT, "corpus": corpus.identity(), "files": [vars(s) for s in corpus.stats],
           "tokenizer": tok.identity()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()[:32]


def shard_directory(corpus: Corpus, tok: ShardTokenizer) -> Path:
    return tokens_home() / shard_key(corpus, tok)


def shared_index(corpus: Corpus, tok: ShardTokenizer) -> Optional[ShardIndex]:
    """The corpus' complete shards in a shared home (read, never written), if one has them."""
    key = shard_key(corpus, tok)
    for home in shared_homes():
        found = read_index(home / "tokens" / key)
        if found is not None:
            return found
    return None


# ---- preparing: once per key, under a lock, into a temporary directory renamed into place


def stderr_progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def prepare_shards(corpus: Corpus, tok: ShardTokenizer, *, rebuild: bool = False, workers: Optional[int] = None,
                   shard_bytes: int = SHARD_BYTES, progress: Progress = stderr_progress) -> ShardIndex:
    """The corpus' token shards: found ready (index.reused), or tokenized now. `rebuild`: tokenize again even when
    they are ready. `workers`: processes of the pool (default: one per CPU, at most one per shard)."""
    final = shard_directory(corpus, tok)
    if not rebuild:
        found = read_index(final) or shared_index(corpus, tok)
        if found is not None:
            return found
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with hold_lock(root / f"{final.name}.lock", final, progress):
        if not rebuild:
            found = read_index(final)  # another process prepared it while this one waited
            if found is not None:
                return found
        for stale in root.glob(f".{final.name}.*"):  # what a crashed preparer left: only the lock holder writes
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # incomplete, damaged or to be rebuilt: moved aside first (readers keep open files)
            old = root / f".{final.name}.old-{os.getpid()}"
            os.rename(final, old)
            shutil.rmtree(old, ignore_errors=True)
        tmp = root / f".{final.name}.tmp-{os.getpid()}"
        tmp.mkdir()
        try:
            index = tokenize_into(tmp, corpus, tok, workers=workers, shard_bytes=shard_bytes, progress=progress)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_dir(root)
    index.directory, index.reused = final, False
    return index


def hold_lock(path: Path, directory: Path, progress: Progress) -> contextlib.AbstractContextManager[None]:
    """The file lock of one shard directory; says once that it waits for another process."""
    return file_lock(path, on_wait=lambda: progress(f"token shards: waiting for another process preparing {directory}"))


def tokenize_into(directory: Path, corpus: Corpus, tok: ShardTokenizer, *, workers: Optional[int],
                  shard_bytes: int, progress: Progress) -> ShardIndex:
    started = time.monotonic()
    dtype = token_dtype(tok.vocab_size)
    tasks = corpus.tasks(shard_bytes)
    if not tasks:
        raise UserError("data.path: the corpus is empty (no bytes to tokenize); point data.path at text", public=True)
    names = [f"shard-{i:05d}.bin" for i in range(len(tasks))]
    total_bytes = sum(task.size_bytes for task in tasks)
    n_workers = max(1, min(len(tasks), workers or available_cpus()))
    progress(f"token shards: tokenizing {corpus.origin} ({total_bytes / 1e6:,.1f} MB, {len(tasks)} shard(s), "
             f"{n_workers} process(es))")
    results: list[Optional[TaskResult]] = [None] * len(tasks)
    meter = Meter(len(tasks), total_bytes, progress)
    if n_workers == 1:
        for i, task in enumerate(tasks):
            results[i] = tokenize_task(task, tok, str(directory / names[i]), dtype.str, own_threads=True)
            meter.done(results[i])
    else:
        with ProcessPoolExecutor(n_workers, mp_context=get_context("spawn")) as pool:  # no torch state forked
            futures = {pool.submit(tokenize_task, task, tok, str(directory / names[i]), dtype.str, own_threads=False): i
                       for i, task in enumerate(tasks)}
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                meter.done(results[futures[future]])
    done = [r for r in results if r is not None]
    for name in names:
        fsync_file(directory / name)
    index = ShardIndex(directory, dtype.name, names, [r.tokens for r in done], sum(r.bytes_read for r in done),
                       corpus.files_read(), sum(r.documents for r in done),
                       {**tok.identity(), "vocab_size": tok.vocab_size}, time.monotonic() - started)
    if isinstance(tok, Subword):
        write_text_atomic(directory / TOKENIZER_FILE, tok.tokenizer_json)
    write_json_atomic(directory / "files.json", {"origin": corpus.origin, **corpus.identity(),
                                                 "files": [vars(s) for s in corpus.stats]})
    write_json_atomic(directory / INDEX_FILE, index.to_json(), indent=1)  # last: a directory with it is complete
    progress(f"token shards: {index.tokens:,} tokens in {len(names)} shard(s), {index.shard_bytes / 1e6:,.1f} MB, "
             f"{index.prepared_s:.1f} s")
    return index


@dataclass(frozen=True)
class TaskResult:
    tokens: int
    bytes_read: int
    documents: int


def tokenize_task(task: Task, tok: ShardTokenizer, out_path: str, dtype: str, *, own_threads: bool) -> TaskResult:
    """One shard: the task's pieces tokenized and appended to `out_path` (in a pool worker, own_threads False)."""
    encode = tok.encoder(own_threads)
    tokens = bytes_read = documents = 0
    with open(out_path, "wb") as out:
        for data, doc_end in task.pieces():
            ids = encode(data, doc_end, task.separator)
            out.write(ids.astype(dtype, copy=False).tobytes())
            tokens += len(ids)
            bytes_read += len(data)
            documents += doc_end
    return TaskResult(tokens, bytes_read, documents)


@dataclass
class Meter:
    """A progress line every PROGRESS_EVERY_S while shards complete."""

    tasks: int
    total_bytes: int
    progress: Progress
    finished: int = 0
    bytes_done: int = 0
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)

    def done(self, result: Optional[TaskResult]) -> None:
        assert result is not None
        self.finished += 1
        self.bytes_done += result.bytes_read
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S and self.finished < self.tasks:
            self.last = now
            rate = self.bytes_done / max(now - self.started, 1e-9)
            left = (self.total_bytes - self.bytes_done) / max(rate, 1e-9)
            self.progress(f"token shards: {self.finished}/{self.tasks} shards, {self.bytes_done / 1e6:,.0f} of "
                          f"{self.total_bytes / 1e6:,.0f} MB, {rate / 1e6:,.1f} MB/s, about {left:,.0f} s left")


# ---- a tokenizer trained once per corpus (data.tokenizer: bpe), beside the shards


def trained_once(corpus: Corpus, settings: dict[str, Any], train: Callable[[], TextTokenizer],
                 progress: Progress = stderr_progress) -> TextTokenizer:
    """`train()`'s tokenizer, kept in `$TRAINFORGE_HOME/tokens/bpe-<key>.json` for this corpus and `settings`:
    every later run (another rank, a trial, a plan) reuses it, and with it the shards it tokenized."""
    doc = {"format": FORMAT, "corpus": corpus.identity(), "files": [vars(s) for s in corpus.stats], **settings}
    key = hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()[:32]
    for home in shared_homes():  # trained by another process that may share it (a server's check), never written
        try:
            stored = json.loads(check_read(home / "tokens" / f"bpe-{key}.json", "data.tokenizer").read_text())
        except (OSError, ValueError):
            continue
        if is_stored(stored):
            return TextTokenizer.from_preprocess(stored)
    path = tokens_home() / f"bpe-{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with hold_lock(path.with_suffix(".lock"), path, progress):
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            stored = None
        if is_stored(stored):
            return TextTokenizer.from_preprocess(stored)
        tok = train()
        write_json_atomic(path, tok.to_preprocess())
    return tok


# ---- reading


class TokenShards:
    """The token stream of a shard directory, read by position without loading it: `read(start, stop)`.

    Each read is a `pread` of the bytes it needs: nothing of the files is mapped into the process, so its resident
    memory stays the same however large the corpus and however much of it an epoch has read (a memory map's fault
    brings neighbouring pages in as well, which madvise on the window alone leaves resident)."""

    def __init__(self, index: ShardIndex) -> None:
        self.paths = [check_read(index.directory / name, "data.path") for name in index.shard_files]
        self.dtype = np.dtype(index.dtype)
        self.starts = np.concatenate([[0], np.cumsum(index.shard_tokens, dtype=np.int64)]).tolist()
        self.tokens = int(self.starts[-1])
        self._fds: dict[int, int] = {}

    def __getstate__(self) -> dict[str, Any]:  # a spawned data worker opens the files itself
        return {**self.__dict__, "_fds": {}}

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _fd(self, i: int) -> int:
        if i not in self._fds:  # pread takes its own offset: a forked worker may share the descriptor
            self._fds[i] = os.open(self.paths[i], os.O_RDONLY | os.O_CLOEXEC)
        return self._fds[i]

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) as int64, across shard boundaries."""
        assert 0 <= start <= stop <= self.tokens, (start, stop, self.tokens)
        out = np.empty(stop - start, dtype=np.int64)
        i, pos, size = bisect_right(self.starts, start) - 1, start, self.dtype.itemsize
        while pos < stop:
            take = min(stop, self.starts[i + 1]) - pos
            if take > 0:
                lo = pos - self.starts[i]
                data = os.pread(self._fd(i), take * size, lo * size)
                if len(data) != take * size:  # the shard shrank after it was checked
                    raise UserError(f"data.path: token shard {self.paths[i]} is shorter than its index says; "
                                    "prepare the corpus again (trainforge data prepare RECIPE --rebuild)")
                out[pos - start : pos - start + take] = np.frombuffer(data, dtype=self.dtype)
            pos += take
            i += 1
        return out

