"""trainforge.files: atomic writes and file locks, the one implementation of each that everything uses."""
from __future__ import annotations

import ast
import json
import os
import stat
from pathlib import Path

import pytest

from trainforge.files import file_lock, lock_file, write_json_atomic, write_text_atomic

SRC = Path(__file__).resolve().parents[1] / "src" / "trainforge"


def test_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    write_json_atomic(target, {"x": 1}, indent=1)
    assert json.loads(target.read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_mode_applies_from_the_first_byte(tmp_path):
    target = tmp_path / "secret.yaml"
    write_text_atomic(target, "token: x\n", mode=0o600)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old")
    with pytest.raises(TypeError):
        write_text_atomic(target, 123)  # type: ignore[arg-type]
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_one_implementation_of_the_atomic_write():
    """No module keeps its own copy of the atomic write (jobs/service.py had one without fsync)."""
    writers = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and "atomic" in node.name and "write" in node.name:
                writers.append(f"{path.relative_to(SRC)}:{node.name}")
    assert sorted(writers) == ["files.py:write_json_atomic", "files.py:write_text_atomic"], writers


def test_a_lock_is_exclusive_or_shared_among_readers(tmp_path):
    path = tmp_path / "x.lock"
    waited = []
    with file_lock(path, shared=True), file_lock(path, shared=True, on_wait=lambda: waited.append(1)):
        assert waited == []  # readers share it
        assert lock_file(path, wait=False) is None  # a writer does not get it meanwhile
    with file_lock(path):
        assert lock_file(path, shared=True, wait=False) is None
    fd = lock_file(path, wait=False)  # free again once the blocks ended
    assert fd is not None
    os.close(fd)


def test_one_implementation_of_the_file_lock():
    """The folder manifests, the token shards and the job server lock through files.lock_file (the token shards
    had a second implementation, with the filelock library)."""
    lockers = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module] if isinstance(node, ast.ImportFrom) else []
            if any(n in ("fcntl", "filelock") for n in names):
                lockers.append(str(path.relative_to(SRC)))
    assert lockers == ["files.py"], lockers
