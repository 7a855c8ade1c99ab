"""WebDataset tar shards: written once by `trainforge data prepare --format webdataset`, read by `data.source:
webdataset` on any number of nodes.

    entry = write_shard(out / shard_name("train", 0), items, first_key=0, num_classes=10)   # one shard
    write_index(out, meta, {"train": [entry, ...], "val": [...], "test": [...]})               # last
    tars = TarShards.open(out)                      # reads index.json only
    data, label, ident = tars.read(i)               # sample i of all splits (train first, then val, test)

A shard is a plain POSIX tar in the WebDataset layout: the members of one sample are consecutive and share a key
(`s000000042.jpg`, `s000000042.cls`, `s000000042.json`), so `tar`, the `webdataset` library and anything else that
reads WebDataset reads them. The image is the original file's bytes (never re-encoded), `.cls` the class index
as ASCII, `.json` where it came from (`{"id": "<class>/<file>", "class": "<name>"}`).

Beside each `<split>-NNNNN.tar` sits `<split>-NNNNN.idx.npy`: per sample, the byte offset and size of its data
member and its label (int64, 3 columns), so a sample is one `pread` and a shard's index is one small file read
the first time that shard is touched. `index.json` lists the splits' shards (samples, bytes, class counts), the
classes and what the prepare found in the source (rows read, drops), and is written last: a directory without
it is an unfinished prepare and is never read.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np

from trainforge.errors import UserError
from trainforge.files import write_text_atomic

FORMAT = "trainforge-webdataset"
VERSION = 1
INDEX = "index.json"
SPLITS = ("train", "val", "test")
OPEN_SHARDS = 8  # per process: open files and loaded shard indexes kept (a rank reads one shard at a time)


class Item(NamedTuple):
    """One sample to write: its data (`ext`: the member's extension, e.g. "jpg"), label and where it came from."""

    data: bytes
    ext: str
    label: int
    ident: str  # e.g. the file's path relative to the image folder
    class_name: str


def shard_name(split: str, n: int) -> str:
    return f"{split}-{n:05d}.tar"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> int:
    """Append a member; the offset of its data in the file (its blocks end where the tar now ends)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0  # mtime 0: the same input gives the same bytes
    tar.addfile(info, io.BytesIO(data))
    tar.members.clear()  # the writer would otherwise keep every member's TarInfo of the shard
    return tar.offset - -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def write_shard(path: Path, items: Iterable[Item], first_key: int, num_classes: int) -> dict[str, Any]:
    """Write `items` in order as one shard (keys from `first_key` on) and its `.idx.npy`; its entry for
    index.json."""
    rows, counts, key = [], np.zeros(num_classes, dtype=np.int64), first_key
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for item in items:
            name = f"s{key:09d}"
            offset = _add(tar, f"{name}.{item.ext}", item.data)
            _add(tar, f"{name}.cls", str(item.label).encode())
            _add(tar, f"{name}.json", json.dumps({"id": item.ident, "class": item.class_name}).encode())
            rows.append((offset, len(item.data), item.label))
            counts[item.label] += 1
            key += 1
    np.save(str(path)[:-4] + ".idx.npy", np.asarray(rows, dtype=np.int64).reshape(-1, 3))
    return {"file": path.name, "samples": len(rows), "bytes": path.stat().st_size, "class_counts": counts.tolist()}


def write_index(out: Path, meta: dict[str, Any], splits: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    index = {"format": FORMAT, "version": VERSION, **meta, "splits": splits}
    write_text_atomic(out / INDEX, json.dumps(index, indent=1) + "\n")
    return index


def read_index(root: Path, field: str = "data.path") -> dict[str, Any]:
    """index.json of a prepared directory; UserError (naming `field`) for anything else."""
    path = root / INDEX
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{field}: {root} has no {INDEX}; write WebDataset shards with `trainforge data prepare "
                        "RECIPE --format webdataset --out DIR` and point data.path at DIR", public=True) from None
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested without end
        raise UserError(f"{field}: {path} cannot be read ({str(e)[:120] or type(e).__name__}); prepare the shards "
                        "again", public=True) from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or index.get("version") != VERSION:
        raise UserError(f"{field}: {path} is not a {FORMAT} index of version {VERSION}; prepare the shards again",
                        public=True)
    splits = index.get("splits")
    for split in SPLITS:  # the shards are files of this directory, named as prepare names them: nothing else is read
        for n, s in enumerate(splits.get(split, []) if isinstance(splits, dict) else [None]):
            if not isinstance(s, dict) or s.get("file") != shard_name(split, n) or not _is_int(s.get("samples")):
                raise UserError(f"{field}: {path} lists a shard that is not {split}-{n:05d}.tar of this directory; "
                                "prepare the shards again", public=True)
    problem = index_problem(index)
    if problem is not None:
        raise UserError(f"{field}: {path} is not an index trainforge writes ({problem}); prepare the shards again",
                        public=True)
    return index


MAX_COUNT = 2**48  # samples, bytes, a class's count: far above any real data set, far below an overflow


def _is_int(v: Any, low: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= MAX_COUNT


def index_problem(index: dict[str, Any]) -> str | None:
    """What in a (format-stamped) index.json is not as `trainforge data prepare` writes it, or None: the fields a run
    reads, each of its type, so that none of them fails later with a traceback."""
    classes = index.get("classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        return "classes: a list of class names"
    kept = index.get("prepared_with")
    if not isinstance(kept, dict) or not all(isinstance(kept.get(k), (int, float)) and not isinstance(kept.get(k), bool)
                                             for k in ("val_fraction", "test_fraction", "shard_samples")):
        return "prepared_with: val_fraction, test_fraction and shard_samples"
    report = index.get("report")
    if not (isinstance(report, dict) and _is_int(report.get("rows_read")) and isinstance(report.get("dropped"), dict)
            and all(isinstance(k, str) and _is_int(v) for k, v in report["dropped"].items())
            and isinstance(report.get("dropped_examples"), dict)
            and all(isinstance(k, str) and isinstance(v, list) for k, v in report["dropped_examples"].items())):
        return "report: rows_read, dropped and dropped_examples"
    if not isinstance(index.get("source"), (str, dict)):
        return "source"
    for split in SPLITS:
        for s in index["splits"].get(split, []):
            counts = s.get("class_counts")
            if not (_is_int(s["samples"]) and _is_int(s.get("bytes")) and isinstance(counts, list)
                    and len(counts) == len(classes) and all(_is_int(c) for c in counts)):
                return f"{s['file']}: samples, bytes and one count per class"
    return None


ROW_COLUMNS = 3  # offset, size, label


def shard_rows(index_path: str, tar_path: str, samples: int, num_classes: int, field: str = "data.path") -> np.ndarray:
    """A shard's `.idx.npy`, checked as trainforge writes it: int64, (samples, 3), every data member inside its tar
    (0 <= offset, 0 <= size, offset + size <= the tar's size), every label a class. Anything else (a pickle, another
    shape or dtype, a size that would allocate terabytes) is a UserError naming the file, before any of it is used."""
    name = Path(index_path).name
    try:
        rows = np.load(index_path, allow_pickle=False, mmap_mode="r")
        tar_bytes = os.stat(tar_path).st_size
    except Exception as e:  # any failure of this file (a pickle is a ValueError: never unpickled; a header shape of
        # 10**30 rows an OverflowError): one line naming it
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
        if "Python objects" in first or "allow_pickle" in first:
            first = "a pickle (object dtype), never unpickled"
        raise UserError(f"{field}: {index_path} is not a shard index trainforge writes ({first}); prepare the shards "
                        "again", public=f"{field}: {name} is not a shard index trainforge writes ({first})") from None
    problem = None
    if rows.dtype != np.int64 or rows.shape != (samples, ROW_COLUMNS):
        problem = f"{rows.dtype} {tuple(rows.shape)}, not int64 ({samples}, {ROW_COLUMNS})"
    elif samples:
        offsets, sizes, labels = rows[:, 0], rows[:, 1], rows[:, 2]
        if int(offsets.min()) < 0 or int(sizes.min()) < 0:
            problem = "a negative offset or size"
        elif int(offsets.max()) > tar_bytes or bool(np.any(sizes > tar_bytes - offsets)):
            problem = f"a sample that reaches past the end of its tar ({tar_bytes} bytes)"
        elif int(labels.min()) < 0 or int(labels.max()) >= num_classes:
            problem = f"a label outside the {num_classes} classes"
    if problem is not None:
        raise UserError(f"{field}: {index_path} is not a shard index trainforge writes ({problem}); prepare the "
                        "shards again", public=f"{field}: {name} is not a shard index trainforge writes ({problem})")
    return np.array(rows)


@dataclass(frozen=True)
class Shard:
    path: str
    samples: int
    start: int  # the index of its first sample among all splits' samples


class TarShards:
    """All samples of a prepared directory, train shards first, then val and test: sample i is read from its
    shard with one `pread` of the data member (no tar parsing, no other sample's bytes). Open files and loaded
    shard indexes are per process (a DataLoader worker opens its own) and at most OPEN_SHARDS of each."""

    def __init__(self, root: Path, index: dict[str, Any]) -> None:
        self.root, self.index = root, index
        self.shards: list[Shard] = []
        self.split_ranges: dict[str, tuple[int, int]] = {}
        start = 0
        for split in SPLITS:
            first = start
            for s in index["splits"].get(split, []):
                self.shards.append(Shard(str(root / s["file"]), int(s["samples"]), start))
                start += int(s["samples"])
            self.split_ranges[split] = (first, start)
        self.starts = np.asarray([s.start for s in self.shards], dtype=np.int64)
        self.total = start
        self._pid, self._files, self._rows = -1, OrderedDict(), OrderedDict()

    @classmethod
    def open(cls, root: Path) -> "TarShards":
        return cls(root, read_index(root))

    def __len__(self) -> int:
        return self.total

    @property
    def num_classes(self) -> int:
        return len(self.index.get("classes") or ())

    def check(self, field: str = "data.path") -> None:
        """Every shard's index checked (`shard_rows`), as the run start and the job admission do before any sample
        is read (each index is mapped, not loaded: a few bytes per sample)."""
        for shard in self.shards:
            shard_rows(shard.path[:-4] + ".idx.npy", shard.path, shard.samples, self.num_classes, field)

    def shard_sizes(self, split: str) -> list[int]:
        first, stop = self.split_ranges[split]
        return [s.samples for s in self.shards if first <= s.start < stop]

    def __getstate__(self) -> dict[str, Any]:  # open files stay in the process that opened them
        return {**self.__dict__, "_pid": -1, "_files": OrderedDict(), "_rows": OrderedDict()}

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, sample within the shard) of sample i."""
        if not 0 <= i < self.total:
            raise IndexError(i)
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return k, i - self.shards[k].start

    def read(self, i: int) -> tuple[bytes, int, str]:
        """(data bytes, label, "<shard file>:<sample>") of sample i."""
        if self._pid != os.getpid():  # a fresh or forked process: the parent's files are not ours to use
            self._pid, self._files, self._rows = os.getpid(), OrderedDict(), OrderedDict()
        k, j = self.locate(i)
        path = self.shards[k].path
        rows = _cached(self._rows, k, lambda: shard_rows(path[:-4] + ".idx.npy", path, self.shards[k].samples,
                                                         self.num_classes))
        offset, size, label = (int(v) for v in rows[j])
        data = os.pread(_cached(self._files, k, lambda: os.open(path, os.O_RDONLY)), size, offset)
        if len(data) != size:
            raise OSError(f"{path}: cut short at sample {j}")
        return data, label, f"{Path(path).name}:{j}"

    def __del__(self) -> None:
        if getattr(self, "_pid", -1) == os.getpid():
            for fd in self._files.values():
                try:
                    os.close(fd)
                except OSError:
                    pass


def _cached(cache: OrderedDict, k: int, load: Any) -> Any:
    """cache[k], loaded on a miss; the least recently used entry beyond OPEN_SHARDS goes (a file is closed)."""
    if k in cache:
        cache.move_to_end(k)
        return cache[k]
    value = cache[k] = load()
    while len(cache) > OPEN_SHARDS:
        _, old = cache.popitem(last=False)
        if isinstance(old, int):
            os.close(old)
    return value


def iter_members(path: Path) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of a tar, in order (tests and tools; training reads through TarShards)."""
    with tarfile.open(path) as tar:
        for m in tar:
            f = tar.extractfile(m)
            if f is not None:
                yield m.name, f.read()
