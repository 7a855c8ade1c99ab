"""Writing files so that a crash at any instant leaves the old content or the new, never a torn file.

    write_text_atomic(run.config, cfg.to_yaml())            # run = layout.RunDir(run_dir)
    write_json_atomic(run.eval, result, indent=1)
    write_text_atomic(state_dir / "recipe.yaml", text, mode=0o600)   # private from the first byte
    check_writable(out_dir, "--out")  # before any work: UserError if out_dir could not be created or written

The text goes to a temporary file beside the target (unique per process and thread), is flushed and
fsynced, renamed over the target, and the directory is fsynced so the rename itself survives a power
loss. Standard library only: `trainforge predict` runs where torch is absent.

`file_lock(path)` holds a lock file for a block (`fcntl.flock`: exclusive, or shared among readers), so that one
process does what others then reuse: a folder's scan, a corpus' token shards, a trained tokenizer; `lock_file` holds
one for as long as its descriptor stays open (one server per state directory).

`trainforge_home()` is the per-user folder of what trainforge remembers between runs (calibration factors,
folder manifests, token shards): `$TRAINFORGE_HOME`, default `~/.cache/trainforge`. `shared_homes()` are others
to reuse prepared data from without writing them ($TRAINFORGE_SHARED_HOME).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from trainforge.errors import UserError

HOME_ENV = "TRAINFORGE_HOME"
SHARED_HOME_ENV = "TRAINFORGE_SHARED_HOME"  # os.pathsep-separated homes to reuse from, never to write (a server's jobs)


def trainforge_home() -> Path:
    """`$TRAINFORGE_HOME`, else `~/.cache/trainforge` (not created here)."""
    return Path(os.environ.get(HOME_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "trainforge"))


def shared_homes() -> tuple[Path, ...]:
    """Homes whose prepared data (token shards, tokenizers, folder manifests) this process may reuse but never
    writes: a job of the server reads its server's cache, which its admission check prepared, and writes its own."""
    value = os.environ.get(SHARED_HOME_ENV, "")
    return tuple(Path(p) for p in value.split(os.pathsep) if p)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_writable(path: Path, field: str = "--run-dir") -> None:
    """Fail early, before any work, if `path` could not be created or written; creates nothing. UserError naming
    `field` (the option that gave the path)."""
    probe = path.resolve()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{field}: {probe} is a file, so {path} cannot be created; choose another directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{field}: {probe} is not writable, so {path} cannot be created there; choose a writable directory")


def write_text_atomic(path: Path, text: Union[str, bytes], mode: int = 0o666) -> None:
    """Replace `path` with `text` (or bytes: a numpy array's .npy); `mode` as for os.open (the umask applies)."""
    path = Path(path)
    if not isinstance(text, (str, bytes)):
        raise TypeError(f"write_text_atomic writes str or bytes, not {type(text).__name__}")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        # text: UTF-8, a lone surrogate (a name from a file, a user) written as its escape, never an error
        how = {"mode": "wb"} if isinstance(text, bytes) else {"mode": "w", "encoding": "utf-8",
                                                               "errors": "backslashreplace"}
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), **how) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, doc: Any, mode: int = 0o666, **dumps: Any) -> None:
    """`doc` as JSON (json.dumps keyword arguments in `dumps`, e.g. indent=1), atomically."""
    write_text_atomic(path, json.dumps(doc, **dumps), mode=mode)


def lock_file(path: Path, *, shared: bool = False, wait: bool = True, on_wait: Optional[Callable[[], None]] = None,
              mode: int = 0o666) -> Optional[int]:
    """A descriptor of `path` (created with `mode` if missing; the umask applies) that holds its lock: exclusive, or
    `shared` with the other shared holders. When another process holds it, wait (calling `on_wait` first), or with
    `wait=False` return None. Closing the descriptor releases the lock, and so does the end of the process, however it
    ends; the descriptor is not inherited by programs the process starts."""
    # flock rather than the filelock library: shared locks for readers, the kernel's release when a holder dies, and no
    # dependency (filelock's Unix lock is this same call). Imported here: Unix only, and the rest of this module is not
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                os.close(fd)
                return None
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, op)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def file_lock(path: Path, *, shared: bool = False, on_wait: Optional[Callable[[], None]] = None) -> Iterator[None]:
    """Hold the lock file `path` for the block (see `lock_file`); `on_wait` is called once if it must wait for it."""
    fd = lock_file(path, shared=shared, on_wait=on_wait)
    assert fd is not None
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


# ---------------------------------------------------------------- reading a file someone else controls


class Unreadable(OSError):
    """A file that is not a plain, readable regular file (a link, a FIFO, a device, a folder, too large); the
    message says which, in words a dashboard can show."""


def _kind(mode: int) -> str:
    import stat

    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: Path, *, follow_links: bool = False) -> int:
    """A read-only descriptor of `path`, which must be a regular file: opened without following a link (unless
    `follow_links`: a user's own recipe may be one) and without blocking (a FIFO never holds the caller), then
    checked with fstat on what was opened (no race with a rename). Unreadable naming why; FileNotFoundError when
    there is none. The caller closes the descriptor."""
    import stat

    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:  # O_NOFOLLOW: the last component is a symbolic link
            raise Unreadable(f"{Path(path).name} is a link, not a regular file") from None
        raise Unreadable(f"{Path(path).name} cannot be opened ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise Unreadable(f"{Path(path).name} is {_kind(mode)}, not a regular file")
    return fd


def read_regular(path: Path, max_bytes: int, *, offset: int = 0, tail: bool = False,
                 follow_links: bool = False) -> tuple[bytes, int, int]:
    """Up to `max_bytes` of a regular file (see open_regular), from byte `offset`, or its last `max_bytes` with
    `tail`: (data, the offset after it, the file's size when opened). Never more than `max_bytes` is read, whatever
    the file claims or grows to while it is read."""
    fd = open_regular(path, follow_links=follow_links)
    try:
        info = os.fstat(fd)
        size = info.st_size
        start = max(0, size - max_bytes) if tail else min(max(0, offset), size)
        os.lseek(fd, start, os.SEEK_SET)
        chunks, left = [], max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        return data, start + len(data), size
    finally:
        os.close(fd)
