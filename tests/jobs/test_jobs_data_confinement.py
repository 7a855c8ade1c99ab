"""Data roots held by one check that every read goes through (`data.roots.check_read`), attacked with symbolic
links its earlier, per-source checks did not follow (issue 26, finding 3): WebDataset shards linked out of a root,
torchvision ImageFolder class folders linked out of one, constructor arguments that name files anywhere; a link
swapped in after the job was admitted; and the fence alone, with the check switched off."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

with warnings.catch_warnings():  # starlette's note about its httpx-based TestClient is not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from jobs_helpers import QUICK, landlock_missing, make_service, stop_all_jobs, wait_for
from trainforge.data.prepare import prepare_data
from trainforge.jobs import runner, sandbox
from trainforge.jobs.server import create_app
from trainforge.jobs.service import Submission
from trainforge.jobs.store import FINAL_STATES

CLIENT = {"X-Trainforge-Client": "test"}
SMALL = ["model.name=mlp", "model.args={}", "data.augment.rotation_deg=0", "data.augment.crop_scale=null",
         "train.global_batch_size=8", "data.normalize=none"]

pytestmark = pytest.mark.skipif(bool(landlock_missing()), reason=landlock_missing() or "-")


def write_images(folder: Path, per_class: int = 6) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        (folder / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / c / f"{i}.png")
    return folder


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A folder outside every data root: an image folder, and WebDataset shards prepared from it."""
    from trainforge.config import DataConfig

    root = tmp_path_factory.mktemp("outside")
    write_images(root / "images")
    cfg = DataConfig(source="imagefolder", path=str(root / "images"), val_fraction=0.25, test_fraction=0.0)
    prepare_data(cfg, seed=0, data_format="webdataset", out=root / "shards", shard_samples=3)
    return root


def wds_job(path: Path) -> dict:
    return {"recipe": "digits_cnn", "overrides": [*QUICK, "data.source=webdataset", f"data.path={path}",
                                                  "data.args={image_size: 8}", "data.val_fraction=0.25",
                                                  "data.test_fraction=0.0", *SMALL]}


def imagefolder_job(root: Path) -> dict:
    return {"recipe": "digits_cnn", "overrides": [*QUICK, "data.source=torchvision",
                                                  f"data.args={{name: ImageFolder, root: '{root}', image_size: 8}}",
                                                  *SMALL]}


def shards_in(root: Path, outside: Path, link: bool) -> Path:
    """A copy of the outside shards in `root`, or one whose shards (not its index) are links to the outside ones."""
    folder = root / ("linked-shards" if link else "shards")
    folder.mkdir()
    for f in sorted((outside / "shards").iterdir()):
        if link and f.name != "index.json":
            (folder / f.name).symlink_to(f)
        else:
            shutil.copy2(f, folder / f.name)
    return folder


def refused(r, *words: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert "\n" not in detail and str(Path("/").resolve()) != detail
    for w in words:
        assert w in detail, detail
    return detail


@pytest.fixture
def api(tmp_path, data_root):
    with TestClient(create_app(make_service(tmp_path, data_roots=[data_root]), manage_service=False),
                    headers=CLIENT) as c:
        yield c


def test_webdataset_shards_linked_out_of_a_root_are_refused_at_admission(api, data_root, outside):
    assert api.post("/api/jobs", json=wds_job(shards_in(data_root, outside, link=False))).status_code == 201
    detail = refused(api.post("/api/jobs", json=wds_job(shards_in(data_root, outside, link=True))),
                     "data.path", "symbolic link leading outside the server's data roots", "train-00000.tar")
    assert str(outside) not in detail  # where the link leads is not said
    (data_root / "linked-index").mkdir()
    (data_root / "linked-index" / "index.json").symlink_to(outside / "shards" / "index.json")
    refused(api.post("/api/jobs", json=wds_job(data_root / "linked-index")), "data.path", "index.json",
            "symbolic link")
    assert len(api.get("/api/jobs").json()) == 1


def test_torchvision_class_folders_linked_out_of_a_root_are_refused_at_admission(api, data_root, outside):
    write_images(data_root / "pets")
    assert api.post("/api/jobs", json=imagefolder_job(data_root / "pets")).status_code == 201
    (data_root / "linked-pets").mkdir()
    (data_root / "linked-pets" / "cat").symlink_to(outside / "images" / "cat")
    shutil.copytree(outside / "images" / "dog", data_root / "linked-pets" / "dog")
    refused(api.post("/api/jobs", json=imagefolder_job(data_root / "linked-pets")), "data.args.root",
            "symbolic link leading outside the server's data roots")
    assert len(api.get("/api/jobs").json()) == 1


def test_torchvision_arguments_that_name_files_are_held_to_the_roots_with_errors_that_say_nothing_of_them(
        api, data_root, tmp_path):
    (tmp_path / "annotations.tsv").write_text("a.jpg#0\ta caption\n")  # outside: tab-separated lines, as Flickr's
    (data_root / "flickr").mkdir()
    (data_root / "flickr" / "link.tsv").symlink_to(tmp_path / "annotations.tsv")

    def flickr(ann_file: str, key: str = "ann_file") -> dict:
        return {"recipe": "digits_cnn", "overrides": [*QUICK, "data.source=torchvision", *SMALL,
                f"data.args={{name: Flickr30k, root: '{data_root / 'flickr'}', kwargs: {{{key}: '{ann_file}'}}}}"]}

    answers = {}
    for probe in (str(tmp_path / "annotations.tsv"), "/etc", "/etc/passwd", "/no/such/file"):
        detail = refused(api.post("/api/jobs", json=flickr(probe)), "data.args.kwargs.ann_file",
                         "outside the server's data roots")
        answers[probe] = detail.replace(repr(probe), "PATH")
    assert len(set(answers.values())) == 1, answers  # the same answer whatever is there: no oracle
    refused(api.post("/api/jobs", json=flickr("annotations.tsv")), "data.args.kwargs.ann_file", "not an absolute path")
    refused(api.post("/api/jobs", json=flickr(str(data_root / "flickr" / "link.tsv"))), "data.args.kwargs.ann_file",
            "symbolic link")
    refused(api.post("/api/jobs", json=flickr("/etc/passwd", key="captions")), "data.args.kwargs.captions",
            "outside")  # named like a path by its value, not its key
    assert api.get("/api/jobs").json() == []


def fenced_read(service, job, *, check: bool, fence: bool) -> dict:
    """What the job process would read of its training data: the first sample, in the job's environment and (with
    `fence`) inside its fence; without `check`, every data-root check of trainforge is switched off first."""
    paths = service.paths(job.id)
    code = ("import json, sys\n"
            "import trainforge.confine as roots\n"
            + ("" if check else "roots.check_read = lambda path, field, top=None: path\n"
                                "roots.check_found = lambda files, top, field: None\n"
                                "roots.confine = lambda value, field, roots: __import__('pathlib').Path(value)\n") +
            "from trainforge.config import config_from_yaml_text\n"
            "from trainforge.data import build_data\n"
            "from trainforge.errors import UserError\n"
            "cfg = config_from_yaml_text(open('job.yaml').read())\n"
            "try:\n"
            "    bundle = build_data(cfg.data, seed=cfg.seed, fit_stats=False)\n"
            "    bundle.train[0]\n"
            "    print(json.dumps({'read': 'yes'}))\n"
            "except UserError as e:\n"
            "    print(json.dumps({'read': 'refused', 'why': str(e)}))\n"
            "except PermissionError as e:\n"
            "    print(json.dumps({'read': 'denied', 'why': str(e)}))\n")
    for folder in (paths.run, paths.tmp):
        folder.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-c", code], cwd=paths.path, capture_output=True, text=True, timeout=120,
                         env=runner.job_env(service.job_env(job), service.slots[:1], paths),
                         preexec_fn=sandbox.preexec(service.policy(paths)) if fence else None)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_link_swapped_in_after_admission_is_refused_by_the_job_and_the_fence_alone_stops_the_read(
        tmp_path, data_root, outside):
    service = make_service(tmp_path, "cpu:1", data_roots=[data_root])
    folder = shards_in(data_root, outside, link=False)
    job = service.enqueue(Submission("digits_cnn", overrides=tuple(wds_job(folder)["overrides"])))  # real files now
    service.paths(job.id).path.mkdir(parents=True)
    service.paths(job.id).recipe.write_text(job.config_yaml)
    for f in folder.glob("train-*"):  # then links to the same bytes outside every root
        f.unlink()
        f.symlink_to(outside / "shards" / f.name)

    assert fenced_read(service, job, check=False, fence=False)["read"] == "yes"  # the attack works without both
    denied = fenced_read(service, job, check=False, fence=True)  # the check skipped: the fence alone holds
    # the kernel's EACCES, raised as it is or said in one line by the shard index check (which reads the index first)
    assert denied["read"] in ("denied", "refused") and "Permission denied" in denied["why"], denied
    assert "train-00000." in denied["why"], denied
    refusal = fenced_read(service, job, check=True, fence=True)  # with the check: one line, before any read
    assert refusal["read"] == "refused" and "symbolic link leading outside" in refusal["why"], refusal

    def ended() -> bool:
        service.tick()
        return service.get(job.id).state in FINAL_STATES

    try:
        wait_for(ended, 120, "the job to end", 0.2)
    finally:
        stop_all_jobs(service)
    done = service.get(job.id)
    assert done.state == "failed" and "bad input: not retried" in done.reason, done.reason
    assert "train-00000.tar" in done.reason and "symbolic link leading outside" in done.reason
    log = service.paths(job.id).log.read_text()
    assert "Traceback" not in log and not (Path(done.run_dir) / "checkpoints").exists()


@pytest.mark.slow
def test_a_job_reuses_what_its_check_prepared_from_the_servers_cache_and_writes_only_its_own(tmp_path, data_root):
    write_images(data_root / "photos")
    service = make_service(tmp_path, "cpu:1", data_roots=[data_root])
    job = service.enqueue(Submission("digits_cnn", overrides=(*QUICK, "train.max_steps=4", "data.source=imagefolder",
                                                             f"data.path={data_root / 'photos'}",
                                                             "data.args={image_size: 8}", *SMALL)))
    cache = service.state_dir / "cache"
    prepared = sorted(p.name for p in (cache / "manifests").glob("*.json"))
    assert len(prepared) == 1  # the check scanned the folder once, into the server's cache
    policy = service.policy(service.paths(job.id))
    assert str(cache) in policy.read and str(cache) not in policy.write

    def ended() -> bool:
        service.tick()
        return service.get(job.id).state in FINAL_STATES

    try:
        wait_for(ended, 120, "the job to end", 0.2)
    finally:
        stop_all_jobs(service)
    done = service.get(job.id)
    assert done.state == "succeeded", done.reason
    scan = json.loads((Path(done.run_dir) / "data_report.json").read_text())["manifest"]
    assert scan["status"] == "reused" and Path(scan["path"]) == cache / "manifests" / prepared[0]  # read, not rescanned
