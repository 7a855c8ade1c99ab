"""A home to reuse from, never to write ($TRAINFORGE_SHARED_HOME): what a job server's admission check prepared
(token shards, a trained tokenizer, a folder's manifest) is read by the job from the server's cache, while all the
job writes goes to its own home; what the shared home lacks or has stale is prepared in the job's own."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np

from data_helpers import data_cfg, write_png
from trainforge.data import build_data
from trainforge.data.formats.token_shards import TextFiles, prepare_shards
from trainforge.data.text.codec import RawBytes


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} if folder.exists() else set()


def read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)


def test_token_shards_and_a_folder_manifest_are_reused_from_the_shared_home_and_never_written_there(
        tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("the quick brown fox\n" * 200)
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        for i in range(4):
            write_png(tmp_path / "images" / c / f"{i}.png", rng, size=8)
    server, job = tmp_path / "server-cache", tmp_path / "job-home"
    monkeypatch.setenv("TRAINFORGE_HOME", str(server))  # the check: prepares into the server's cache
    prepared = prepare_shards(TextFiles.of([docs / "a.txt"], None, "docs"), RawBytes())
    build_data(data_cfg("imagefolder", path=str(tmp_path / "images"), args={"image_size": 8}), seed=0)
    before = files_under(server)
    read_only(server)  # as the job's fence makes it

    monkeypatch.setenv("TRAINFORGE_HOME", str(job))  # the job: its own home, the server's cache to read from
    monkeypatch.setenv("TRAINFORGE_SHARED_HOME", str(server))
    again = prepare_shards(TextFiles.of([docs / "a.txt"], None, "docs"), RawBytes())
    assert again.reused and again.directory == prepared.directory and server in again.directory.parents
    bundle = build_data(data_cfg("imagefolder", path=str(tmp_path / "images"), args={"image_size": 8}), seed=0)
    scan = bundle.report["manifest"]
    assert scan["status"] == "reused" and Path(scan["path"]).parent == server / "manifests"
    assert files_under(server) == before and not (job / "tokens").exists()

    (docs / "b.txt").write_text("a second file\n" * 50)  # a corpus the server has not prepared: the job's own
    own = prepare_shards(TextFiles.of([docs / "a.txt", docs / "b.txt"], None, "docs"), RawBytes())
    assert not own.reused and job in own.directory.parents and files_under(server) == before
    os.utime(tmp_path / "images" / "cat" / "0.png", ns=(1, 1))  # a changed file: the shared manifest is stale
    bundle = build_data(data_cfg("imagefolder", path=str(tmp_path / "images"), args={"image_size": 8}), seed=0)
    scan = bundle.report["manifest"]
    assert Path(scan["path"]).parent == job / "manifests" and scan["status"] == "created"
    assert files_under(server) == before
