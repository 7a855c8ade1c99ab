"""WebDataset shards: `trainforge data prepare --format webdataset` writes them from an image folder, `data.source:
webdataset` trains on them; each rank reads its own shards in the order ShardOrder defines (docs/data.md,
"Streaming"), and a run killed mid-epoch resumes exactly."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
import webdataset as wds  # the reference reader of the format

import trainforge
from data_helpers import data_cfg, write_png
from trainforge.cli import main
from trainforge.data import build_data
from trainforge.data.stages.loader import ShardBatchSampler, ShardOrder, TrainBatches, epoch_samples
from trainforge.data.prepare import prepare_data
from trainforge.data.formats.tar_shards import TarShards, iter_members
from trainforge.errors import UserError

SRC = str(Path(trainforge.__file__).resolve().parents[1])
MODELS = str(Path(__file__).parent)
RECIPE = """name: wds
seed: 0
data: {source: webdataset, val_fraction: 0.1, test_fraction: 0.1, normalize: none, args: {image_size: 8}}
model: {name: custom, target: "image_models:record_samples"}
optim: {name: sgd, lr: 0.1}
train: {device: cpu, global_batch_size: 8, max_steps: 10, early_stopping: null, eval_every_steps: 100}
log: {progress: false, tensorboard: false}
"""


def recipe(tmp: Path) -> Path:
    path = tmp / "wds.yaml"
    path.write_text(RECIPE)
    return path


# ---------------------------------------------------------------------------------------------- the order contract

def full_streams(order: ShardOrder, epoch: int, world: int) -> list[list[int]]:
    return [list(order.stream(0, epoch, r, world)) for r in range(world)]


def shard_of(order: ShardOrder, i: int) -> int:
    return int(np.searchsorted(order.starts, i, side="right")) - 1


def test_ranks_read_disjoint_whole_shards_and_each_shard_in_the_same_order_for_any_world_size():
    sizes = [5, 5, 5, 5, 3, 5, 2]
    order = ShardOrder(sizes)
    by_shard = {}
    for world in (1, 2, 3):
        streams = full_streams(order, epoch=1, world=world)
        assert sorted(i for s in streams for i in s) == list(range(sum(sizes)))  # every sample once, over the ranks
        owners = [{shard_of(order, i) for i in s} for s in streams]
        assert all(not (a & b) for n, a in enumerate(owners) for b in owners[n + 1 :])  # disjoint shards
        seq = defaultdict(list)
        for s in streams:
            for i in s:
                seq[shard_of(order, i)].append(i)
        if by_shard:
            assert seq == by_shard  # a shard's samples come in the same order whatever the world size
        by_shard = dict(seq)
        assert order.rank_samples(world) == sum(sorted(sizes)[: len(sizes) // world])
        assert all(len(s) >= order.rank_samples(world) for s in streams)
    assert full_streams(order, 2, 1) != full_streams(order, 1, 1)  # reshuffled each epoch
    assert full_streams(order, 1, 2) == full_streams(ShardOrder(sizes), 1, 2)  # a pure function
    with pytest.raises(UserError, match="fewer than the 8 processes"):
        order.rank_samples(8)


def test_the_sampler_deals_equal_steps_and_resumes_at_any_position_with_any_micro_batch():
    order = ShardOrder([7] * 9 + [1])
    geometry = dict(seed=0, global_batch_size=8, world_size=2)
    samplers = [ShardBatchSampler(order, rank=r, micro_batch_size=4, **geometry) for r in range(2)]
    assert samplers[0].steps_per_epoch == 7  # 29 samples a rank (4 shards of 7 and the one of 1), 4 a step
    for epoch in (0, 3):
        whole = []
        for s in samplers:
            s.set_position(epoch, 0)
            whole.append([k for batch in s for k in batch])
        assert [len(w) for w in whole] == [28, 28]
        assert [i for _, i in whole[0]] == list(order.stream(0, epoch, 0, 2))[:28]
        for position in (8, 24, 48):  # samples of all ranks together: 1, 3 and 6 steps in
            for micro in (4, 2):
                s = ShardBatchSampler(order, rank=1, micro_batch_size=micro, **geometry)
                s.set_position(epoch, position)
                assert [k for batch in s for k in batch] == whole[1][position // 2 :]


# ---------------------------------------------------------------------------------------------- prepare

def numbered_folder(root: Path, n: int) -> None:
    """n 8x8 images of one colour each that encodes its number (red + 256 * green); classes a (even) and b (odd)."""
    for i in range(n):
        path = root / ("a" if i % 2 == 0 else "b") / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), (i % 256, i // 256, 0), dtype=np.uint8)).save(path)


def prepare(folder: Path, out: Path, *extra: str, shard_samples: int = 7) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "trainforge", "data", "prepare", str(recipe(folder.parent)),
                           "data.source=imagefolder", f"data.path={folder}", "--format", "webdataset", "--out", str(out),
                           "--shard-samples", str(shard_samples), "--json", *extra],
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    numbered_folder(root / "images", 80)
    proc = prepare(root / "images", root / "shards")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, json.loads(proc.stdout)


def test_prepare_writes_the_kept_files_as_shards_the_webdataset_library_reads(tmp_path):
    rng = np.random.default_rng(0)
    originals = {}
    for c in ("cat", "dog"):
        for i in range(12):
            originals[f"{c}/{i}.png"] = write_png(tmp_path / "images" / c / f"{i}.png", rng, size=8)
    (tmp_path / "images" / "dog" / "copy.png").write_bytes(originals["dog/3.png"])  # duplicate
    (tmp_path / "images" / "cat" / "cut.png").write_bytes(originals["cat/1.png"][:40])  # cut short
    cfg = data_cfg("imagefolder", path=str(tmp_path / "images"), val_fraction=0.25, test_fraction=0.0)
    result = prepare_data(cfg, seed=0, data_format="webdataset", out=tmp_path / "shards", shard_samples=5)
    assert result["samples"] == {"train": 18, "val": 6, "test": 0} and result["shards"]["train"] == 4
    assert result["dropped"]["duplicate"] == 1 and result["dropped"]["corrupt"] == 1 and result["rows_read"] == 26

    seen = {}
    for sample in wds.WebDataset(sorted(str(p) for p in (tmp_path / "shards").glob("train-*.tar")), shardshuffle=False):
        meta = json.loads(sample["json"])
        assert sample["png"] == originals[meta["id"]]  # the file's bytes, not re-encoded
        assert int(sample["cls"]) == ["cat", "dog"].index(meta["class"])
        seen[sample["__key__"]] = meta["id"]
    assert len(seen) == 18 and len(set(seen.values())) == 18
    names = [name for name, _ in iter_members(tmp_path / "shards" / "train-00000.tar")]
    assert names[:3] == ["s000000000.png", "s000000000.cls", "s000000000.json"]  # a sample's members together

    bundle = build_data(data_cfg("webdataset", path=str(tmp_path / "shards"), args={"image_size": 8},
                                 val_fraction=0.25, test_fraction=0.0, normalize="none"), seed=0)
    assert bundle.report["splits"] == {"train": 18, "val": 6, "test": 0} and bundle.report["split_method"] == "prepared"
    assert bundle.report["dropped"]["duplicate"] == 1 and bundle.report["rows_read"] == 26
    assert sum(bundle.report["class_counts"]["train"].values()) == 18
    tars = TarShards.open(tmp_path / "shards")
    for i in (0, 7, 19):  # what the source decodes is the original file's image
        data, label, _ = tars.read(i)
        expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32) / 255
        x, y = (bundle.train if i < 18 else bundle.val)[i if i < 18 else i - 18]
        assert torch.equal(x, torch.from_numpy(expected.transpose(2, 0, 1))) and int(y) == label


def test_the_pretrained_models_preprocessing_reads_the_shards_as_it_reads_the_files(tmp_path):
    from torchvision.models import ResNet18_Weights

    from trainforge.config import FromModelConfig

    rng = np.random.default_rng(1)
    for c in ("cat", "dog"):
        for i, (h, w) in enumerate([(30, 40), (41, 33), (50, 50)]):
            (tmp_path / "images" / c).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "images" / c / f"{i}.png")
    prepare_data(data_cfg("imagefolder", path=str(tmp_path / "images"), val_fraction=0.0, test_fraction=0.0), seed=0,
                 data_format="webdataset", out=tmp_path / "shards", shard_samples=4)
    bundle = build_data(data_cfg("webdataset", path=str(tmp_path / "shards"), normalize="model", val_fraction=0.0,
                                 test_fraction=0.0, from_model=FromModelConfig(family="torchvision", source="resnet18",
                                                                               weights="DEFAULT")), seed=0)
    transform = ResNet18_Weights.DEFAULT.transforms()  # metadata only: no weights are downloaded
    tars = TarShards.open(tmp_path / "shards")
    assert bundle.info.input_shape == (3, 224, 224) and len(bundle.train) == 6
    for i in range(6):
        expected = transform(Image.open(io.BytesIO(tars.read(i)[0])).convert("RGB"))
        assert (bundle.train[i][0] - expected).abs().max() <= 1e-5


def test_prepare_reuses_its_shards_and_never_writes_over_anything_else(tmp_path):
    numbered_folder(tmp_path / "images", 20)
    first = prepare(tmp_path / "images", tmp_path / "shards")
    assert first.returncode == 0, first.stderr[-2000:]
    again = prepare(tmp_path / "images", tmp_path / "shards")
    assert again.returncode == 0 and json.loads(again.stdout)["reused"] is True
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()}
    other = prepare(tmp_path / "images", tmp_path / "shards", shard_samples=4)  # other settings: refused
    assert other.returncode == 2 and "--rebuild" in other.stderr and "Traceback" not in other.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()} == before
    rebuilt = prepare(tmp_path / "images", tmp_path / "shards", "--rebuild", shard_samples=4)
    assert rebuilt.returncode == 0 and json.loads(rebuilt.stdout)["shards"]["train"] == 4  # 16 train samples / 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".shards.")]  # no temporary left
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    foreign = prepare(tmp_path / "images", tmp_path / "mine")
    assert foreign.returncode == 2 and "not empty" in foreign.stderr
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_bad_webdataset_input_is_one_line(tmp_path, capsys):
    numbered_folder(tmp_path / "images", 6)
    cases = [
        (["data", "prepare", "digits_cnn", f"data.path={tmp_path / 'images'}", "data.source=imagefolder", "--format",
          "webdataset"], "--out: required"),
        (["data", "prepare", "digits_cnn", "--format", "webdataset", "--out", str(tmp_path / "o")],
         "writes the shards of an image folder"),
        (["data", "prepare", "charlm_gpt", "--out", str(tmp_path / "o")], "--out: applies to --format webdataset"),
        (["data", "prepare", "digits_cnn", "data.source=imagefolder", f"data.path={tmp_path / 'images'}", "--format",
          "webdataset", "--out", str(tmp_path / "o"), "--shard-samples", "0"], "--shard-samples: must be 1 or more"),
        (["train", "digits_cnn", "data.source=webdataset", f"data.path={tmp_path / 'images'}"], "has no index.json"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, (args, err)
        assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------------------------- runs

def train(shards: Path, run_dir: Path, records: Path, *extra: str, nproc: int = 1) -> subprocess.CompletedProcess:
    records.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, RECORD_DIR=str(records),
               PYTHONPATH=os.pathsep.join([SRC, MODELS, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "trainforge", "train", str(recipe(run_dir.parent)), f"data.path={shards}",
           f"train.micro_batch_size={8 // nproc}", *extra, "--run-dir", str(run_dir)]
    if nproc > 1:
        cmd += ["--nproc-per-node", str(nproc)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def recorded(records: Path, rank: int) -> list[tuple[int, list[int]]]:
    return [(r["pid"], r["ids"]) for r in map(json.loads, (records / f"rank{rank}.jsonl").read_text().splitlines())]


def contract(shards: Path, world: int, rank: int, micro: int, steps: int) -> list[list[int]]:
    """What ShardOrder says rank `rank` of `world` reads, as image numbers, micro-batch by micro-batch."""
    tars = TarShards.open(shards)
    order = ShardOrder(tars.shard_sizes("train"))
    per_epoch = order.rank_samples(world) * world // 8  # steps an epoch, global batch 8
    batches = []
    for epoch in range(-(-steps // per_epoch)):
        stream = list(order.stream(0, epoch, rank, world))[: per_epoch * 8 // world]
        batches += [stream[i : i + micro] for i in range(0, len(stream), micro)]
    number = {}
    for i in {i for b in batches for i in b}:
        data, _, _ = tars.read(i)
        r, g, _ = Image.open(io.BytesIO(data)).convert("RGB").getpixel((0, 0))
        number[i] = r + 256 * g
    return [[number[i] for i in b] for b in batches[:steps]]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


@pytest.mark.serial
@pytest.mark.slow
def test_two_ranks_read_disjoint_shards_in_the_contract_order_and_resume_exactly_after_a_kill(prepared, tmp_path,
                                                                                                monkeypatch):
    root, result = prepared
    shards = root / "shards"
    assert result["samples"]["train"] == 64 and result["shards"]["train"] == 10  # 9 shards of 7, one of 1

    # one process, in this one: the same recipe and overrides `train` gives the CLI
    (tmp_path / "rec-one").mkdir()
    monkeypatch.setenv("RECORD_DIR", str(tmp_path / "rec-one"))
    cfg = trainforge.load_config(str(recipe(tmp_path)), [f"data.path={shards}", "train.micro_batch_size=8"])
    trainforge.train(cfg, run_dir=tmp_path / "one")
    one = [ids for _, ids in recorded(tmp_path / "rec-one", 0)]
    assert one == contract(shards, 1, 0, 8, 10)  # one process: all shards, 8 steps an epoch, into the second

    train(shards, tmp_path / "ref", tmp_path / "rec-ref", nproc=2)
    two = [[ids for _, ids in recorded(tmp_path / "rec-ref", r)] for r in range(2)]
    assert two == [contract(shards, 2, r, 4, 10) for r in range(2)]  # 7 steps an epoch, 4 samples a rank a step
    tars = TarShards.open(shards)
    first_epoch = [{i for b in two[r][:7] for i in b} for r in range(2)]
    assert not first_epoch[0] & first_epoch[1]  # no sample on both ranks in an epoch

    def shard_sequences(batches: list[list[int]]) -> dict[int, list[int]]:
        shard_by_number = {}
        for i in range(len(tars)):
            data, _, name = tars.read(i)
            r, g, _ = Image.open(io.BytesIO(data)).convert("RGB").getpixel((0, 0))
            shard_by_number[r + 256 * g] = name.split(":")[0]
        seq = defaultdict(list)
        for b in batches:
            for n in b:
                seq[shard_by_number[n]].append(n)
        return seq

    # the contract across world sizes: a shard one process read whole in epoch 0 comes in the same order on 2 ranks
    single = shard_sequences(one[:8])
    for r in range(2):
        for shard, seq in shard_sequences(two[r][:7]).items():
            assert single[shard][: len(seq)] == seq, shard  # whole, or cut where the rank's epoch ends

    # killed on rank 1 in step 4 (checkpoints every 2 steps): the launcher restarts both ranks from step 2
    proc = train(shards, tmp_path / "run", tmp_path / "rec-run", "model.args={kill_rank: 1, kill_call: 4}",
                 "train.checkpoint_every_steps=2", "--max-restarts", "1", nproc=2)
    assert "resumed at step 2" in proc.stderr
    for r in range(2):
        rows = recorded(tmp_path / "rec-run", r)
        pids = list(dict.fromkeys(pid for pid, _ in rows))
        assert len(pids) == 2  # the first attempt and the restart
        first, second = ([ids for pid, ids in rows if pid == p] for p in pids)
        assert first[:2] + second == two[r]  # from the checkpoint on, exactly what the uninterrupted run read
    a, b = weights(tmp_path / "ref"), weights(tmp_path / "run")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_reads_the_shards_with_any_worker_count_and_counts_epochs_by_shards(prepared):
    root, _ = prepared
    cfg = data_cfg("webdataset", path=str(root / "shards"), args={"image_size": 8}, normalize="none",
                   val_fraction=0.1, test_fraction=0.1)
    bundle = build_data(cfg, seed=0)
    assert len(bundle.train) == 64 and epoch_samples(bundle.train, 1) == 64 and epoch_samples(bundle.train, 2) == 58
    seen = []
    for workers in (0, 2):
        batches = TrainBatches(bundle.train, seed=0, micro_batch_size=4, global_batch_size=8, num_workers=workers,
                               pin_memory=False, rank=1, world_size=2)
        seen.append([x for x, _ in batches.at(epoch=1, position=2)])
    assert len(seen[0]) == 5 and all(torch.equal(a, b) for a, b in zip(*seen))


def test_an_index_naming_files_outside_its_directory_is_refused(prepared, tmp_path):
    root, _ = prepared
    index = json.loads((root / "shards" / "index.json").read_text())
    for bad in ("/etc/passwd", "../images/a/0000.png", "train-00001.tar"):
        copy = tmp_path / bad.replace("/", "_")
        copy.mkdir()
        doc = json.loads(json.dumps(index))
        doc["splits"]["train"][0]["file"] = bad
        (copy / "index.json").write_text(json.dumps(doc))
        with pytest.raises(UserError, match="lists a shard that is not train-00000.tar"):
            TarShards.open(copy)
