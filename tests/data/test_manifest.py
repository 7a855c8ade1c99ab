"""An image folder's scan is remembered (issue 17): later builds read only what changed, no process decodes the
folder to plan or admit a job, and a file that fails to decode at run time is replaced, counted and dropped
by the next run. Work is counted (files read, decodes), never timed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

import trainforge
from data_helpers import data_cfg, write_png
from trainforge.data import build_data
from trainforge.data.formats import manifest
from trainforge.data.stages.loader import PositionBatchSampler, make_train_loader
from trainforge.data.summary import summarize

SRC = str(Path(trainforge.__file__).resolve().parents[1])  # this tree's src: subprocesses must import it too


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """Each test its own TRAINFORGE_HOME: manifests of one test never meet another's."""
    path = tmp_path / "home"
    monkeypatch.setenv("TRAINFORGE_HOME", str(path))
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    """2 classes x 6 distinct 8x8 PNGs."""
    rng = np.random.default_rng(1)
    root = tmp_path / "images"
    for name in ("a", "b"):
        for i in range(6):
            write_png(root / name / f"{i}.png", rng, size=8)
    return root


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The paths of every file the scan reads (hashes), in this process."""
    seen: list[str] = []
    real = manifest.read_file

    def spy(path: str):
        seen.append(Path(path).relative_to(Path(path).parents[1]).as_posix())
        return real(path)

    monkeypatch.setattr(manifest, "read_file", spy)
    return seen


def cfg(root: Path, **fields):
    return data_cfg("imagefolder", path=str(root), args={"image_size": 8}, **fields)


def test_later_builds_read_only_new_and_changed_files_and_report_removed_ones(folder, reads, home):
    first = build_data(cfg(folder), seed=0).report["manifest"]
    assert first["status"] == "created" and first["read"] == first["files"] == 12 and len(reads) == 12
    assert Path(first["path"]).parent == home / "manifests" and not list(folder.rglob("*.json"))  # not in the data

    reads.clear()
    again = build_data(cfg(folder), seed=0).report["manifest"]
    assert again["status"] == "reused" and again["read"] == 0 and reads == []

    rng = np.random.default_rng(2)
    write_png(folder / "a" / "0.png", rng, size=9)  # changed: other bytes, other size
    (folder / "b" / "5.png").unlink()  # removed
    write_png(folder / "b" / "new.png", rng, size=8)  # new
    bundle = build_data(cfg(folder), seed=0)
    m = bundle.report["manifest"]
    assert (m["status"], m["new"], m["changed"], m["removed"], m["read"]) == ("updated", 1, 1, 1, 2)
    assert sorted(reads) == ["a/0.png", "b/new.png"]
    assert bundle.report["rows_read"] == 12
    assert "1 new, 1 changed, 1 removed" in summarize(bundle.report).notes[0]
    scans = json.loads(Path(m["path"]).read_text())["scans"]
    assert [s["read"] for s in scans] == [12, 2]  # the manifest's own record: two scans, no more


def test_a_damaged_or_foreign_manifest_is_rebuilt_never_reused(folder, tmp_path, reads, capfd):
    path = Path(build_data(cfg(folder), seed=0).report["manifest"]["path"])
    path.write_text('{"format": "trainforge-imagefolder-manifest", "version": 1, "root": "/x", "files": {')
    reads.clear()
    m = build_data(cfg(folder), seed=0).report["manifest"]
    assert m["status"] == "rebuilt" and "damaged" in m["rebuilt_because"] and len(reads) == 12
    assert "is rebuilt" in capfd.readouterr().err

    other = tmp_path / "other"  # a copy of the folder: same files, another path, never the first one's manifest
    for f in folder.rglob("*.png"):
        (other / f.relative_to(folder)).parent.mkdir(parents=True, exist_ok=True)
        (other / f.relative_to(folder)).write_bytes(f.read_bytes())
    other_path = Path(build_data(cfg(other), seed=0).report["manifest"]["path"])
    assert other_path != path
    other_path.write_bytes(path.read_bytes())  # the first folder's manifest where the copy's belongs
    m = build_data(cfg(other), seed=0).report["manifest"]
    assert m["status"] == "rebuilt" and "another folder" in m["rebuilt_because"]

    doc = json.loads(path.read_text())
    doc["version"] = 0
    path.write_text(json.dumps(doc))
    m = build_data(cfg(folder), seed=0).report["manifest"]
    assert m["status"] == "rebuilt" and "version" in m["rebuilt_because"]


def test_an_interrupted_scan_keeps_what_it_read(folder, reads):
    path = Path(build_data(cfg(folder), seed=0).report["manifest"]["path"])
    doc = json.loads(path.read_text())
    doc["complete"] = False  # as a scan killed after its first save: 5 of the files were read
    doc["files"] = {k: v[:5] for k, v in doc["files"].items()}
    path.write_text(json.dumps(doc))
    reads.clear()
    m = build_data(cfg(folder), seed=0).report["manifest"]
    assert m["status"] == "updated" and m["read"] == 7 and len(reads) == 7


def test_odd_file_names_round_trip(tmp_path, reads):
    rng = np.random.default_rng(3)
    root = tmp_path / "odd"
    names = ["quote\"and'back\\slash.png", "new\nline.png", "ünï cødé.png", os.fsdecode(b"latin1-\xe9.png")]
    for n in names:
        write_png(root / "x" / n, rng, size=8)
        write_png(root / "y" / n, rng, size=8)
    first = build_data(cfg(root), seed=0).report
    assert first["rows_kept"] == 8
    reads.clear()
    again = build_data(cfg(root), seed=0).report
    assert again["manifest"]["status"] == "reused" and reads == [] and again["splits"] == first["splits"]


@pytest.fixture
def decodes(monkeypatch) -> list[str]:
    """Every full decode of an image file (Pillow's load), in this process."""
    seen: list[str] = []
    real = ImageFile.ImageFile.load

    def spy(self):
        seen.append(str(getattr(self, "filename", "")))
        return real(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return seen


def test_planning_and_admission_decode_no_image(folder, decodes):
    overrides = ["data.source=imagefolder", f"data.path={folder}", "data.args={image_size: 8}", "model.name=mlp",
                 "model.args={hidden: [16]}", "train.global_batch_size=4", "train.micro_batch_size=4"]
    doc = trainforge.plan(trainforge.load_config(None, overrides), gpus=["h100-sxm"], num_gpus=[1])
    assert doc["candidates"] and decodes == []  # the first scan reads headers only: nothing decoded either
    from trainforge.jobs.admission import size_submission
    from trainforge.jobs.slots import Slot

    slot = Slot(id="cpu0", kind="cpu", name="cpu", memory_bytes=8 * 2**30, total_bytes=8 * 2**30)
    size_submission(trainforge.load_config(None, overrides), 1, [slot])
    assert decodes == []
    build_data(cfg(folder), seed=0)  # training does decode: the spy sees it (normalization statistics)
    assert decodes


def broken_png(path: Path) -> None:
    """A PNG whose header and end are intact but whose pixel data does not inflate: it opens, it ends with IEND,
    and it fails only when decoded."""
    Image.fromarray(np.full((8, 8, 3), 7, dtype=np.uint8)).save(path)
    data = bytearray(path.read_bytes())
    at = data.index(b"IDAT")
    length = int.from_bytes(data[at - 4 : at], "big")
    body = bytes([0x78, 0x9C]) + bytes([0xFF] * (length - 2))  # a zlib stream of garbage
    crc = zlib.crc32(b"IDAT" + body).to_bytes(4, "big")
    data[at + 4 : at + 4 + length + 4] = body + crc
    path.write_bytes(bytes(data))


def test_a_file_failing_at_run_time_in_a_worker_is_replaced_counted_and_dropped_next_time(folder):
    broken_png(folder / "a" / "broken.png")
    config = cfg(folder, normalize="none", val_fraction=0.0, test_fraction=0.0)
    bundle = build_data(config, seed=0)
    assert bundle.report["dropped"]["corrupt"] == 0 and len(bundle.train) == 13  # it opens: kept at the scan
    sampler = PositionBatchSampler(len(bundle.train), seed=0, micro_batch_size=13, global_batch_size=13)
    loader = make_train_loader(bundle.train, sampler, num_workers=1, pin_memory=False)
    sampler.set_position(0, 0)
    (x, y), = list(loader)  # read in the worker process
    assert x.shape == (13, 3, 8, 8)  # the batch keeps its size
    assert bundle.runtime_report() == {"decode_failed": 1, "examples": ["a/broken.png"]}  # seen from this process

    again = build_data(config, seed=0)  # a new run drops it before the split
    assert again.report["dropped"]["corrupt"] == 1 and again.report["dropped_examples"]["corrupt"] == ["a/broken.png"]
    assert len(again.train) == 12 and again.preprocess["dropped_failed_before"] == ["a/broken.png"]
    resumed = build_data(config, seed=0, stored=bundle.preprocess)  # a resume of the first run keeps its split
    assert len(resumed.train) == 13
    assert torch.equal(resumed.train[(0, 3)][0], bundle.train[(0, 3)][0])


def test_replacement_is_the_next_sample_of_the_split(folder):
    broken_png(folder / "a" / "broken.png")
    bundle = build_data(cfg(folder, normalize="none", val_fraction=0.0, test_fraction=0.0), seed=0)
    i = bundle.train.samples.ids.index("a/broken.png")
    at = int(np.flatnonzero(bundle.train.indices == i)[0])
    nxt = (at + 1) % len(bundle.train)
    assert torch.equal(bundle.train[at][0], bundle.train[nxt][0])


def test_normalization_comes_from_a_seeded_sample_of_the_train_split(folder, monkeypatch):
    from trainforge.data import pipeline

    monkeypatch.setattr(pipeline, "MAX_STATS_SAMPLES", 4)
    sample = build_data(cfg(folder), seed=5).report["normalization"]["sample"]
    assert sample == {"samples": 4, "of": len(build_data(cfg(folder), seed=5).train), "seed": 5, "unreadable": 0}
    train = np.arange(100)
    assert np.array_equal(pipeline.stats_sample(train, 5), pipeline.stats_sample(train, 5))
    assert not np.array_equal(pipeline.stats_sample(train, 5), pipeline.stats_sample(train, 6))


def test_concurrent_processes_scan_once(folder, home):
    """Three processes scan the same folder at once: one reads the files, the others wait and reuse its manifest."""
    code = ("import sys, pathlib; from trainforge.data.formats.manifest import folder_manifest; "
            "r = folder_manifest(pathlib.Path(sys.argv[1])).report; print(r['status'], r['read'])")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
               TRAINFORGE_HOME=str(home))
    procs = [subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert all(p.returncode == 0 for p in procs)
    assert outs == ["created 12", "reused 0", "reused 0"]
    scans = json.loads(next((home / "manifests").glob("*.json")).read_text())["scans"]
    assert len(scans) == 1
