"""Data roots: the folders a job server lets submitted recipes read, and nothing outside them.

    roots = parse_roots(["/srv/data"])                  # `trainforge server --data-root DIR` (resolved, must exist)
    path = confine("/srv/data/cats/../dogs", "data.path", roots)   # a path a user named: its real path, or UserError
    real = check_read(shard, "data.path", top=root)      # THE check of every file a job opens for data or weights
    confined_roots()                                     # in a job process: the server's roots, else None
    local_path("/srv/data/bert", "model.args.pretrained")  # a job re-checks a pretrained folder before loading it

`trainforge train` on the command line reads whatever its user names (roots are None: unconfined). The job
server passes its roots to every job process (and to the check of a submission) in TRAINFORGE_DATA_ROOTS, and
every file they open for data or weights goes through `check_read` first: its real path (symbolic links
followed) must lie under a root, or under the process's own cache folder ($TRAINFORGE_HOME: manifests, token
shards, which the server makes private to each job) or its server's ($TRAINFORGE_SHARED_HOME, read-only). The
sources call it for the path a recipe names, for every file a scan finds (before any is read), for the shards an
index lists, for the files of a torchvision dataset and for pretrained folders. A path a user named is first
judged lexically (`confine`), so nothing outside the roots is even looked at (no stat, no readlink). What is
opened after the check (a link swapped in that instant) is stopped by the job's sandbox (jobs/sandbox.py), which
only lets it read the roots, the caches and its own folders.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

from trainforge.errors import UserError, quote
from trainforge.files import shared_homes, trainforge_home

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
    return _checked(lexical, field, roots, value)


def _checked(path: Path, field: str, roots: Sequence[Path], named: str, top: Optional[Path] = None) -> Path:
    """The real path of `path` when it lies under `roots`, else UserError naming `field` (and the file by its name
    in `top`, never by where the link leads)."""
    real = Path(os.path.realpath(path))
    if _under(real, roots):
        return real
    if top is None:
        raise UserError(f"{field}: {quote(named)} leads outside the server's data roots through a symbolic link; "
                        "copy the data under a data root", public=True)
    rel = path.relative_to(top) if top in path.parents else path.name
    raise UserError(f"{field}: {quote(str(rel))} in it is a symbolic link leading outside the server's data roots; "
                    "copy that file under a data root", public=True)


def check_read(path: Path, field: str, top: Optional[Path] = None) -> Path:
    """The path to open for `path`, a file a job reads for data or weights (found in `top` by a scan, listed by an
    index, kept in a cache): in a job of the server, its real path, which must lie under the data roots or the
    job's own cache folder, else UserError naming `field`; on the command line, `path` as it is."""
    roots = confined_roots()
    if roots is None:
        return Path(path)
    caches = (trainforge_home(), *shared_homes())  # its own (private to the job) and its server's (read-only)
    return _checked(Path(path), field, (*roots, *(Path(os.path.realpath(c)) for c in caches)), str(path), top)


PATH_WORDS = ("file", "path", "dir", "root", "folder")  # an argument named like this names a file or folder


def named_paths(tree: Any, field: str) -> list[tuple[str, str]]:
    """(dotted field, value) of every string in `tree` (a library's keyword arguments, e.g. data.args.kwargs) that
    names a file: by its key (ann_file, img_dir, ...) or by its form (absolute, ~, ./, or with a slash). The server
    confines each like data.path, so a constructor argument cannot make a job (or a check) open a file elsewhere."""
    found: list[tuple[str, str]] = []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, (list, tuple)) else ()
    for key, value in items:
        here = f"{field}.{key}"
        if isinstance(value, str):
            if any(w in str(key).lower() for w in PATH_WORDS) or value.startswith(("/", "~", ".")) \
                    or "/" in value or "\\" in value:
                found.append((here, value))
        else:
            found += named_paths(value, here)
    return found


def check_found(files: Sequence[Path], top: Path, field: str) -> None:
    """Files found by scanning `top` (a folder under the roots): none may be a link leading outside them."""
    if confined_roots() is None:
        return
    for f in files:
        check_read(f, field, top)


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
