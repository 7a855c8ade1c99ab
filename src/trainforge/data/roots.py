"""Data roots: the folders a job server lets submitted recipes read, and nothing outside them.

    roots = parse_roots(["/srv/data"])                  # `trainforge server --data-root DIR` (resolved, must exist)
    path = confine("/srv/data/cats/../dogs", "data.path", roots)   # the real path, or UserError
    confined_roots()                                     # in a job process: the server's roots, else None
    local_path("/srv/data/bert", "model.args.pretrained")  # a job re-checks a pretrained folder before loading it

`trainforge train` on the command line reads whatever its user names (roots are None: unconfined). The job
server passes its roots to every job process in TRAINFORGE_DATA_ROOTS, and the data sources then refuse any
path, and any file found while scanning a folder, whose real path (symlinks resolved) leaves them. A path is
first judged lexically, so nothing outside the roots is even looked at (no stat, no readlink).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from trainforge.errors import UserError, quote

MAX_TREE_ENTRIES = 10_000  # a pretrained model folder is a few files; a walk never goes further
ENV = "TRAINFORGE_DATA_ROOTS"  # os.pathsep-separated absolute real paths; set by the job server for its jobs
NO_ROOTS_HINT = "the server reads no data paths until its operator names a folder with `trainforge server --data-root DIR`"


def parse_roots(values: Sequence[str]) -> tuple[Path, ...]:
    """--data-root values as real, absolute, existing directories (UserError naming the flag otherwise)."""
    roots = []
    for value in values:
        path = Path(value).expanduser()
        if not path.is_dir():
            raise UserError(f"--data-root: {value} is not a directory; pass an existing folder of data")
        roots.append(Path(os.path.realpath(path)))
    return tuple(dict.fromkeys(roots))


def roots_env(roots: Sequence[Path]) -> str:
    return os.pathsep.join(str(r) for r in roots)


def confined_roots() -> Optional[tuple[Path, ...]]:
    """The roots this process is confined to (a job of the server), or None (the command line: unconfined)."""
    value = os.environ.get(ENV)
    if value is None:
        return None
    return tuple(Path(p) for p in value.split(os.pathsep) if p)


def _under(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def confine(value: str, field: str, roots: Sequence[Path]) -> Path:
    """The real path of `value` if it lies under one of `roots` (symlinks resolved), else UserError."""
    if not roots:
        raise UserError(f"{field}: {NO_ROOTS_HINT}", public=True)
    allowed = ", ".join(str(r) for r in roots)
    if "\0" in value:  # no file name holds one, and os.path raises ValueError on it
        raise UserError(f"{field}: {quote(value)} holds a NUL byte, which no path can; give a path under a data root "
                        f"({allowed})", public=True)
    path = Path(value)
    if not path.is_absolute():
        raise UserError(f"{field}: {quote(value)} is not an absolute path; give a path under a data root ({allowed})",
                        public=True)
    lexical = Path(os.path.normpath(path))  # ".." segments resolved before anything is looked up
    if not _under(lexical, roots):
        raise UserError(f"{field}: {quote(value)} is outside the server's data roots ({allowed}); "
                        "put the data there or ask the operator", public=True)
    real = Path(os.path.realpath(lexical))
    if not _under(real, roots):
        raise UserError(f"{field}: {quote(value)} leads outside the server's data roots through a symbolic link; "
                        "copy the data under a data root", public=True)
    return real


def check_found(files: Sequence[Path], top: Path, field: str) -> None:
    """Files found by scanning `top` (a folder under the roots): none may be a link leading outside them."""
    roots = confined_roots()
    if roots is None:
        return
    for f in files:
        if not _under(Path(os.path.realpath(f)), roots):
            rel = f.relative_to(top) if top in f.parents else f.name
            raise UserError(f"{field}: {quote(str(rel))} in it is a symbolic link leading outside the server's data "
                            "roots; copy that file under a data root", public=True)


def confine_tree(folder: Path, field: str, roots: Sequence[Path]) -> None:
    """Every file and folder under `folder` lies under `roots` (no symbolic link leads out), else UserError."""
    entries = 0
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        for name in (*dirnames, *filenames):
            entries += 1
            if entries > MAX_TREE_ENTRIES:
                raise UserError(f"{field}: {quote(str(folder))} holds more than {MAX_TREE_ENTRIES} files and folders; "
                                "a pretrained model is a few files", public=True)
            confine(str(Path(dirpath) / name), field, roots)  # a link leading out: refused


def local_path(value: str, field: str) -> Path:
    """The path a loader opens for `value`: in a job process (confined), its real path checked again against
    the roots, with everything under it when it is a folder (the folder may have changed since the job was
    admitted); on the command line, `value` with ~ expanded."""
    roots = confined_roots()
    if roots is None:
        return Path(value).expanduser()
    real = confine(value, field, roots)
    if real.is_dir():
        confine_tree(real, field, roots)
    return real
