"""Writing files so that a crash at any instant leaves the old content or the new, never a torn file.

    write_text_atomic(run.config, cfg.to_yaml())            # run = layout.RunDir(run_dir)
    write_json_atomic(run.eval, result, indent=1)
    write_text_atomic(state_dir / "recipe.yaml", text, mode=0o600)   # private from the first byte
    check_writable(out_dir, "--out")  # before any work: UserError if out_dir could not be created or written

The text goes to a temporary file beside the target (unique per process and thread), is flushed and
fsynced, renamed over the target, and the directory is fsynced so the rename itself survives a power
loss. Standard library only: `trainforge predict` runs where torch is absent.

`trainforge_home()` is the per-user folder of what trainforge remembers between runs (calibration factors,
folder manifests, token shards): `$TRAINFORGE_HOME`, default `~/.cache/trainforge`. `shared_homes()` are others
to reuse prepared data from without writing them ($TRAINFORGE_SHARED_HOME).
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

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


def write_text_atomic(path: Path, text: str, mode: int = 0o666) -> None:
    """Replace `path` with `text`; `mode` as for os.open (the umask applies)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
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
