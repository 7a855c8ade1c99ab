"""A folder's scan, remembered: the manifest of an image folder (`data.source: imagefolder`).

    scan = folder_manifest(root)        # lists the folder; reads only the files that are new or changed
    scan.classes, scan.files            # sorted class names; one FileFacts per image file, in scan order
    scan.report                         # data_report.json's `manifest` section

The first scan of a folder reads every image file once: the SHA-256 of its bytes (to find duplicates) and its
header with Pillow (format, width, height, mode). No pixel is decoded, except in a file whose end is missing
(a truncated PNG, JPEG, GIF or WebP: `COMPLETE`) or whose format has no such cheap check, which is decoded to
decide. Files are read in a process pool over the available cores. The result goes, atomically, to
`$TRAINFORGE_HOME/manifests/<sha256 of the folder's real path>.json` (default home `~/.cache/trainforge`),
never into the data folder, which may be read-only. Later scans list the folder (one stat per file) and read
again only the files whose size or mtime changed; new, changed and removed files are counted.

One process scans at a time: a lock file beside the manifest (`files.file_lock`). A process takes it shared to
read the manifest; only when it is missing or stale does it take it exclusively, read it again (another process
may just have brought it up to date: ranks of one run, parallel tune trials, two jobs) and read what is left. A
long scan says how far it is every PROGRESS_S and saves what it has every CHECKPOINT_S, so a crash loses at
most that much work. A manifest that cannot be read, is of another format version or describes another folder
is rebuilt, with a line on stderr saying why. Delete the file (its path is in data_report.json) to force a
full rescan.

Files that fail to decode at run time (in any process, DataLoader workers included) are appended to
`<key>.failures.jsonl` beside the manifest (`FailureLog`); the next scan marks them `decode_failed`.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import io
import json
import multiprocessing
import os
import stat
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Optional

from PIL import Image

from trainforge.confine import check_found, check_read
from trainforge.files import file_lock, shared_homes, trainforge_home, write_text_atomic
from trainforge.hardware.cpus import available_cpus

FORMAT = "trainforge-imagefolder-manifest"
VERSION = 1
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
PARALLEL_MIN_FILES = 256  # fewer files are read in this process: a pool costs more than it saves
CHUNK_FILES = 64  # files per task of the pool
PROGRESS_S = 10.0  # a long scan prints how far it is this often
CHECKPOINT_S = 60.0  # ... and saves what it has read this often (a crash loses at most this much)
MAX_SCAN_RECORDS = 20  # the manifest keeps the record of this many of its latest scans
OK, CORRUPT, UNREADABLE, DECODE_FAILED = "ok", "corrupt", "unreadable", "decode_failed"
VERDICTS = (OK, CORRUPT, UNREADABLE, DECODE_FAILED)


class FileFacts(NamedTuple):
    path: str  # relative to the folder, "/"-separated; its first part is the class folder
    label: int  # index into the classes
    size_bytes: int
    mtime_ns: int
    sha256: str  # hex; "" when the file could not be read
    format: str  # Pillow's name (JPEG, PNG ...); "" when not an image
    width: int
    height: int
    mode: str  # Pillow's mode (RGB, L, P ...)
    verdict: str  # one of VERDICTS


Read = tuple[str, str, int, int, str, str]  # what reading a file tells: sha256, format, width, height, mode, verdict


@dataclass(frozen=True)
class FolderScan:
    classes: list[str]
    files: list[FileFacts]
    report: dict[str, Any]
    failures: Optional["FailureLog"]  # where run-time decode failures go (None: no writable manifest folder)


# ---------------------------------------------------------------------------------------------- reading files

def _png_complete(data: bytes) -> bool:
    return data.endswith(b"\x00\x00\x00\x00IEND\xaeB`\x82")


def _jpeg_complete(data: bytes) -> bool:
    return data.rstrip(b"\x00").endswith(b"\xff\xd9")  # end-of-image marker (some writers pad with zeros)


def _gif_complete(data: bytes) -> bool:
    return data.endswith(b";")  # the trailer byte


def _webp_complete(data: bytes) -> bool:
    return len(data) >= 12 and int.from_bytes(data[4:8], "little") + 8 <= len(data)  # RIFF size fits the file


# formats whose files can be seen to be whole without decoding them; any other format is decoded once to decide
COMPLETE: dict[str, Callable[[bytes], bool]] = {
    "PNG": _png_complete, "JPEG": _jpeg_complete, "GIF": _gif_complete, "WEBP": _webp_complete,
}


def read_file(path: str) -> Read:
    """Read one file once: its SHA-256, its header, and a verdict (decoded only when it may be cut short)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:  # unreadable (permissions, vanished): dropped like a file that does not decode
        return "", "", 0, 0, "", UNREADABLE
    digest = hashlib.sha256(data).hexdigest()
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, (width, height), mode = img.format or "", img.size, img.mode
            complete = COMPLETE.get(fmt)
            if complete is None or not complete(data):
                img.load()  # full decode: the only way to tell for this file
    except Exception:  # PIL raises many types (OSError, SyntaxError, ValueError ...) for bad files
        return digest, "", 0, 0, "", CORRUPT
    return digest, fmt, width, height, mode, OK


def read_chunk(paths: list[str]) -> list[Read]:
    return [read_file(p) for p in paths]


def read_files(paths: list[str], workers: int) -> Iterator[Read]:
    """read_file of each path, in order; in a pool of `workers` processes when there are many."""
    if workers <= 1 or len(paths) < PARALLEL_MIN_FILES:
        yield from map(read_file, paths)
        return
    chunks = [paths[i : i + CHUNK_FILES] for i in range(0, len(paths), CHUNK_FILES)]
    # fork: the workers need only this module, already imported; spawn would import torch again in each
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        for reads in pool.map(read_chunk, chunks):
            yield from reads


# ---------------------------------------------------------------------------------------------- listing

class Listed(NamedTuple):
    path: str
    label: int
    size_bytes: int
    mtime_ns: int


def list_folder(root: Path) -> tuple[list[str], list[Listed]]:
    """Class names (sorted subfolder names, hidden ones skipped) and every image file under them, in sorted
    order (by path components, like sorted(Path.rglob)); hidden files skipped, links to files followed, links
    to folders below a class folder not (as Path.rglob)."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files: list[Listed] = []
    for label, name in enumerate(classes):
        found: list[tuple[str, int, int]] = []
        _walk(str(root / name), name, found)
        found.sort(key=lambda f: f[0].split("/"))
        files.extend(Listed(rel, label, size, mtime) for rel, size, mtime in found)
    return classes, files


def _walk(folder: str, rel: str, out: list[tuple[str, int, int]]) -> None:
    try:
        with os.scandir(folder) as it:
            entries = list(it)
    except OSError:  # unreadable folder: skipped, as Path.rglob does
        return
    for e in entries:
        try:
            is_dir = e.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            if not e.is_symlink():
                _walk(e.path, f"{rel}/{e.name}", out)
            continue
        if e.name.startswith(".") or os.path.splitext(e.name)[1].lower() not in IMAGE_SUFFIXES:
            continue
        try:
            st = e.stat()  # follows a link: the file it names
        except OSError:  # a broken link
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((f"{rel}/{e.name}", st.st_size, st.st_mtime_ns))


# ---------------------------------------------------------------------------------------------- the manifest file

def manifest_dir() -> Path:
    return trainforge_home() / "manifests"


def manifest_key(real_root: str) -> str:
    return hashlib.sha256(os.fsencode(real_root)).hexdigest()[:32]


@dataclass
class Stored:
    entries: dict[str, tuple]  # path -> FileFacts fields after the path and label
    scans: list[dict[str, Any]]
    complete: bool
    classes: list[str]


def read_manifest(path: Path, real_root: str) -> tuple[Optional[Stored], str]:
    """The stored manifest, or None and why it cannot be used ("" when there is none)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, f"it cannot be read ({e.strerror})"
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return None, "it is not a trainforge manifest"
        if doc.get("version") != VERSION:
            return None, f"it is of format version {doc.get('version')!r}, this trainforge writes {VERSION}"
        if doc.get("root") != real_root:
            return None, f"it describes another folder ({doc.get('root')!r})"
        cols = doc["files"]
        names = ("size_bytes", "mtime_ns", "sha256", "format", "width", "height", "mode", "verdict")
        columns = [cols["path"]] + [cols[n] for n in names]
        if len({len(c) for c in columns}) != 1:
            raise ValueError("columns of different lengths")
        entries = {p: rest for p, *rest in zip(*columns)}
        if not all(isinstance(p, str) and isinstance(r[0], int) and isinstance(r[1], int) and r[7] in VERDICTS
                   for p, r in entries.items()):
            raise ValueError("a file entry of the wrong type")
        entries = {p: tuple(r) for p, r in entries.items()}
        classes = doc["classes"]
        if not isinstance(classes, list):
            raise ValueError("classes is not a list")
        return Stored(entries, list(doc.get("scans", []))[-MAX_SCAN_RECORDS:], bool(doc.get("complete")), classes), ""
    except (ValueError, KeyError, TypeError, IndexError):
        return None, "it is damaged (not the JSON this trainforge writes)"


def write_manifest(path: Path, real_root: str, classes: list[str], files: list[FileFacts],
                   scans: list[dict[str, Any]], complete: bool) -> None:
    cols: dict[str, list] = {name: [getattr(f, name) for f in files] for name in FileFacts._fields if name != "label"}
    doc = {"format": FORMAT, "version": VERSION, "root": real_root, "complete": complete, "classes": classes,
           "files": cols, "scans": scans[-MAX_SCAN_RECORDS:]}
    write_text_atomic(path, json.dumps(doc, separators=(",", ":")))


def locked(path: Path, exclusive: bool, root: Path) -> contextlib.AbstractContextManager[None]:
    """Hold the lock file `path` (shared or exclusive) for the block; says so on stderr when it must wait."""
    return file_lock(path, shared=not exclusive,
                     on_wait=lambda: say(f"data: waiting for another process scanning {root} (lock {path})"))


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- run-time failures

class FailureLog:
    """Files that failed to decode at run time, one JSON line each, appended by any process (O_APPEND)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, rel: str, size_bytes: int, mtime_ns: int, error: str) -> None:
        line = json.dumps({"path": rel, "size_bytes": size_bytes, "mtime_ns": mtime_ns, "error": error[:200]}) + "\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                os.write(fd, line.encode("utf-8", "surrogateescape"))
            finally:
                os.close(fd)
        except OSError:  # the count is lost, not the run
            pass

    def failed(self) -> dict[str, tuple[int, int]]:
        """path -> (size_bytes, mtime_ns) of each file recorded (a line torn by a crash is skipped)."""
        out: dict[str, tuple[int, int]] = {}
        try:
            text = self.path.read_bytes().decode("utf-8", "surrogateescape")
        except OSError:
            return out
        for line in text.splitlines():
            try:
                rec = json.loads(line)
                out[rec["path"]] = (int(rec["size_bytes"]), int(rec["mtime_ns"]))
            except (ValueError, KeyError, TypeError):
                continue
        return out


# ---------------------------------------------------------------------------------------------- the scan

@dataclass
class Diff:
    todo: list[Listed]  # files to read: new or changed
    new: int
    changed: int
    removed: int
    marked: int  # files found to fail at run time, now marked decode_failed
    facts: dict[str, FileFacts]  # files whose stored facts still hold

    def stale(self, stored: Optional[Stored], classes: list[str]) -> bool:
        return (stored is None or not stored.complete or bool(self.todo) or self.removed > 0 or self.marked > 0
                or classes != stored.classes)


def diff(stored: Optional[Stored], listing: list[Listed], failed: dict[str, tuple[int, int]]) -> Diff:
    """What of `listing` the stored facts still describe (same size and mtime), and what must be read again."""
    entries = stored.entries if stored is not None else {}
    todo, facts, new, changed, marked = [], {}, 0, 0, 0
    for f in listing:
        old = entries.get(f.path)
        if old is None:
            new += 1
            todo.append(f)
        elif old[0] != f.size_bytes or old[1] != f.mtime_ns:
            changed += 1
            todo.append(f)
        else:
            verdict = old[7]
            if failed.get(f.path) == (f.size_bytes, f.mtime_ns) and verdict == OK:
                verdict, marked = DECODE_FAILED, marked + 1
            facts[f.path] = FileFacts(f.path, f.label, *old[:7], verdict)
    listed = {f.path for f in listing}
    removed = sum(1 for p in entries if p not in listed)
    return Diff(todo, new, changed, removed, marked, facts)


def folder_manifest(root: Path, workers: Optional[int] = None) -> FolderScan:
    """The folder's classes and per-file facts, from its manifest, reading only what changed (see the module)."""
    real_root = os.path.realpath(root)
    classes, listing = list_folder(root)
    check_found([root / f.path for f in listing], root, "data.path")  # before any of them is read
    workers = workers or available_cpus()
    folder = manifest_dir()
    key = manifest_key(real_root)
    path, lock = check_read(folder / f"{key}.json", "data.path"), folder / f"{key}.lock"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with locked(lock, False, root):
            pass
    except OSError as e:
        warnings.warn(f"data: no manifest for {root}: {folder} is not writable ({e.strerror}); every run reads the "
                      "whole folder: set TRAINFORGE_HOME to a writable folder")
        return _scan_uncached(root, classes, listing, workers)
    failures = FailureLog(folder / f"{key}.failures.jsonl")
    for home in shared_homes():  # a manifest another process keeps where this one may not write (a server's check)
        shared = check_read(home / "manifests" / f"{key}.json", "data.path")
        stored, _ = read_manifest(shared, real_root)
        d = diff(stored, listing, failures.failed())
        if stored is not None and not d.stale(stored, classes):
            report = {"path": str(shared), "status": "reused", "files": len(listing), "new": 0, "changed": 0,
                      "removed": 0, "read": 0, "last_scan": stored.scans[-1] if stored.scans else None}
            return FolderScan(classes, [d.facts[f.path] for f in listing], report, failures)
    with locked(lock, False, root):
        stored, problem = read_manifest(path, real_root)
        d = diff(stored, listing, failures.failed())
    status, record = "reused", None
    if d.stale(stored, classes):
        with locked(lock, True, root):
            stored, problem = read_manifest(path, real_root)  # another process may have just written it
            d = diff(stored, listing, failures.failed())
            if d.stale(stored, classes):
                status = "rebuilt" if problem else ("created" if stored is None else "updated")
                if problem:
                    say(f"data: the manifest of {root} ({path}) is rebuilt: {problem}")
                d.facts, record = _read_changed(root, path, real_root, classes, listing, d, stored, workers)
    if record is None:
        d.new = d.changed = d.removed = 0  # nothing this process did (another one may just have)
        record = stored.scans[-1] if stored is not None and stored.scans else None
    report = {
        "path": str(path), "status": status, "files": len(listing), "new": d.new, "changed": d.changed,
        "removed": d.removed, "read": len(d.todo) if status != "reused" else 0, "last_scan": record,
    }
    if status == "rebuilt":
        report["rebuilt_because"] = problem
    return FolderScan(classes, [d.facts[f.path] for f in listing], report, failures)


def _read_changed(root: Path, path: Path, real_root: str, classes: list[str], listing: list[Listed], d: Diff,
                  stored: Optional[Stored], workers: int) -> tuple[dict[str, FileFacts], dict[str, Any]]:
    """Read the new and changed files (in a pool), saving progress every CHECKPOINT_S; write the manifest."""
    facts = dict(d.facts)
    scans = stored.scans if stored is not None else []
    todo, start = d.todo, time.monotonic()
    long = len(todo) >= 10 * PARALLEL_MIN_FILES
    if long:
        say(f"data: scanning {root}: {len(todo):,} of {len(listing):,} image files to read "
            f"({workers} processes); the manifest goes to {path}")
    last_progress = last_save = start
    for i, (f, read) in enumerate(zip(todo, read_files([str(root / f.path) for f in todo], workers)), 1):
        facts[f.path] = _facts(f, read)
        now = time.monotonic()
        if now - last_progress >= PROGRESS_S:
            rate = i / (now - start)
            say(f"data: scanning {root}: {i:,} of {len(todo):,} files read ({rate:,.0f}/s, "
                f"about {(len(todo) - i) / rate:,.0f} s left)")
            last_progress = now
        if now - last_save >= CHECKPOINT_S:  # saved as an incomplete manifest: the next scan starts from here
            kept = [facts[x.path] for x in listing if x.path in facts]
            write_manifest(path, real_root, classes, kept, scans, complete=False)
            last_save = now
    seconds = time.monotonic() - start
    record = {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "pid": os.getpid(),
              "files": len(listing), "read": len(todo), "new": d.new, "changed": d.changed, "removed": d.removed,
              "marked_decode_failed": d.marked, "seconds": round(seconds, 3)}
    write_manifest(path, real_root, classes, [facts[f.path] for f in listing], scans + [record], complete=True)
    if todo or d.removed or long:
        say(f"data: manifest of {root}: {d.new:,} new, {d.changed:,} changed, {d.removed:,} removed files; "
            f"read {len(todo):,} in {seconds:.1f} s ({path})")
    return facts, record


def _facts(f: Listed, read: Read) -> FileFacts:
    sha, fmt, width, height, mode, verdict = read
    return FileFacts(f.path, f.label, f.size_bytes, f.mtime_ns, sha, fmt, width, height, mode, verdict)


def _scan_uncached(root: Path, classes: list[str], listing: list[Listed], workers: int) -> FolderScan:
    files = [_facts(f, r) for f, r in zip(listing, read_files([str(root / f.path) for f in listing], workers))]
    report = {"path": None, "status": "uncached", "files": len(files), "new": len(files), "changed": 0,
              "removed": 0, "read": len(files), "last_scan": None}
    return FolderScan(classes, files, report, None)
