"""Data roots: the folders a job server lets submitted recipes read, and nothing outside them.

    roots = parse_roots(["/srv/data"])                  # `trainforge server --data-root DIR` (resolved, must exist)
    path = confine("/srv/data/cats/../dogs", "data.path", roots)   # the real path, or UserError
    confined_roots()                                     # in a job process: the server's roots, else None

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
