"""`trainforge data prepare`: a recipe's data made ready once, before any run needs it.

    result = prepare_data(cfg.data, seed=cfg.seed)                 # --format tokens: the token shards
    result = prepare_data(cfg.data, seed=cfg.seed, rebuild=True)   # tokenize again, even if they are ready
    result["tokens"], result["shards"], result["directory"], result["reused"]
    result = prepare_data(cfg.data, seed=cfg.seed, data_format="webdataset", out=Path("/shared/photos-wds"))

Runs also do it on first use (`build_data`), under the same lock: preparing first only moves the work, e.g. to
a CPU node ahead of a multi-GPU job, and shows its progress on its own.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import socket
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from trainforge.config import DataConfig
from trainforge.data.stages.clean import drop_failed_before
from trainforge.data.pipeline import split_pool
from trainforge.data.pool import Pool
from trainforge.data.seeding import derive_seed
from trainforge.data.formats.token_shards import prepare_shards, stderr_progress
from trainforge.data.sources import SOURCES
from trainforge.data.sources.imagefolder import ImageFiles
from trainforge.data.formats.tar_shards import FORMAT, INDEX, SPLITS, Item, shard_name, write_index, write_shard
from trainforge.data.text.codec import RawBytes, Subword
from trainforge.data.corpus.tokenize import TextCorpus, corpus_tokenizer
from trainforge.errors import UserError
from trainforge.hardware.cpus import available_cpus
from trainforge.registry import Registry

Prepare = Callable[..., dict[str, Any]]
FORMATS: Registry[Prepare] = Registry("data format", "--format")


SHARD_BYTES = 256 * 2**20  # a WebDataset shard's size by default: long sequential reads, yet many shards to deal out
MAX_SHARD_SAMPLES = 100_000
PROGRESS_S = 5.0


def prepare_data(cfg: DataConfig, *, seed: int, data_format: str = "tokens", rebuild: bool = False,
                 workers: Optional[int] = None, out: Optional[Path] = None,
                 shard_samples: Optional[int] = None) -> dict[str, Any]:
    """The recipe's data in `data_format`, prepared now or found ready; what was written (JSON-able).
    `out` and `shard_samples`: where and how large (samples per shard) for --format webdataset."""
    prepare = FORMATS.get(data_format)
    if workers is not None and workers < 1:
        raise UserError(f"--workers: must be 1 or more, got {workers}")
    if shard_samples is not None and shard_samples < 1:
        raise UserError(f"--shard-samples: must be 1 or more, got {shard_samples}")
    if data_format != "webdataset" and (out is not None or shard_samples is not None):
        raise UserError(f"--{'out' if out is not None else 'shard-samples'}: applies to --format webdataset; "
                        f"--format {data_format} is kept in $TRAINFORGE_HOME")
    return {"format": data_format, **prepare(cfg, seed=seed, rebuild=rebuild, workers=workers, out=out,
                                             shard_samples=shard_samples)}


@FORMATS.register("tokens")
def token_shards(cfg: DataConfig, *, seed: int, rebuild: bool, workers: Optional[int], **_: Any) -> dict[str, Any]:
    """A language-modelling corpus (textfile, hf_datasets without a label column) as memory-mapped token shards."""
    pool = SOURCES.get(cfg.source)(cfg, seed=seed)
    if not isinstance(pool, Pool) or not isinstance(pool.samples, TextCorpus):
        raise UserError(f"data.source: {cfg.source!r} gives no language-modelling corpus; --format tokens prepares "
                        "textfile, or hf_datasets without data.args.label_column", public=True)
    tok = corpus_tokenizer(cfg, pool.samples.corpus, None)
    index = prepare_shards(pool.samples.corpus, RawBytes() if tok is None else Subword.of(tok), rebuild=rebuild,
                           workers=workers, progress=stderr_progress)
    return {"corpus": pool.samples.corpus.origin, "tokenizer": index.tokenizer["kind"], **index.summary()}


# ---------------------------------------------------------------------------------------------- webdataset

ShardTask = tuple[str, list[tuple[str, str, int, str, str]], int, int]  # path, (file, ext, label, id, class), key, classes


def write_shard_task(task: ShardTask) -> dict[str, Any]:
    """One shard of the prepare, written from the original files (in a worker process)."""
    path, files, first_key, num_classes = task
    items = (Item(Path(f).read_bytes(), ext, label, ident, name) for f, ext, label, ident, name in files)
    return write_shard(Path(path), items, first_key, num_classes)


@FORMATS.register("webdataset")
def webdataset_shards(cfg: DataConfig, *, seed: int, rebuild: bool, workers: Optional[int], out: Optional[Path],
                      shard_samples: Optional[int]) -> dict[str, Any]:
    """An image folder's kept files (after the folder's scan: corrupt and duplicate files dropped and counted) as
    WebDataset tar shards in `out`, split as a run splits it (seeded, stratified), train samples shuffled once
    (seeded) so every shard holds a mix of classes. Written to a temporary directory renamed to `out` when
    complete; `out` holding shards of the same files and settings is reused, other shards are replaced only with
    `rebuild`, and a directory holding anything else is never written to."""
    if out is None:
        raise UserError("--out: required with --format webdataset: the directory to write the shards to (e.g. on the "
                        "filesystem every node reads)")
    if cfg.source != "imagefolder":
        raise UserError(f"data.source: --format webdataset writes the shards of an image folder (data.source "
                        f"imagefolder), not of {cfg.source!r}", public=True)
    started, out = time.monotonic(), Path(os.path.abspath(out.expanduser()))
    pool = SOURCES.get(cfg.source)(cfg, seed=seed)
    if pool.failed_before is not None:
        pool = drop_failed_before(pool, None)
    files = pool.samples
    assert isinstance(files, ImageFiles)
    if len(files) == 0:
        raise UserError(f"data.path: no usable images in {files.root} (dropped: {pool.drops.counts})", public=True)
    splits, method = split_pool(pool, cfg, seed)
    per_shard = shard_samples or int(np.clip(SHARD_BYTES // max(1, int(files.stamps[:, 0].mean())), 1,
                                             MAX_SHARD_SAMPLES))
    fingerprint = hashlib.sha256(json.dumps([files.ids, files.stamps.tolist(), list(pool.info.class_names)])
                                 .encode("utf-8", "surrogateescape")).hexdigest()
    source = {"source": cfg.source, "path": files.root, "files": len(files), "fingerprint": fingerprint}
    settings = {"seed": seed, "val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction,
                "dedup": cfg.clean.dedup, "shard_samples": per_shard}
    existing = _existing_index(out)
    if existing is not None and not rebuild:
        if existing.get("source") == source and existing.get("prepared_with") == settings:
            return _summary(out, existing, reused=True)
        raise UserError(f"--out: {out} holds shards prepared from other files or settings; add --rebuild to replace "
                        "them, or choose another directory")
    tmp = out.parent / f".{out.name}.tmp-{_me()}"
    _clear_unfinished(out)
    tmp.mkdir(parents=True)
    try:
        index = _write_webdataset(tmp, files, pool, splits, method, seed, per_shard, workers, started,
                                  {"source": source, "prepared_with": settings})
        if existing is not None or out.exists():
            old = out.parent / f".{out.name}.old-{_me()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _summary(out, index, reused=False)


def _write_webdataset(tmp: Path, files: ImageFiles, pool: Pool, splits: dict[str, np.ndarray], method: str,
                      seed: int, per_shard: int, workers: Optional[int], started: float,
                      meta: dict[str, Any]) -> dict[str, Any]:
    classes = list(pool.info.class_names)
    order = {"train": np.random.default_rng(derive_seed("webdataset", seed)).permutation(splits["train"]),
             "val": splits["val"], "test": splits["test"]}
    tasks: list[tuple[str, ShardTask]] = []
    key = 0
    for split in SPLITS:
        idx = order[split]
        for n, start in enumerate(range(0, len(idx), per_shard)):
            chosen = idx[start : start + per_shard].tolist()
            rows = [(files.paths[i], Path(files.ids[i]).suffix.lower().lstrip("."), int(files.labels[i]),
                     files.ids[i], classes[int(files.labels[i])]) for i in chosen]
            tasks.append((split, (str(tmp / shard_name(split, n)), rows, key, len(classes))))
            key += len(chosen)
    written: dict[str, list[dict[str, Any]]] = {split: [] for split in SPLITS}
    procs = min(workers or available_cpus(), len(tasks))
    last = time.monotonic()
    # fork: the workers need only what is imported already; spawn would import torch again in each
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else None)
    with ProcessPoolExecutor(max_workers=procs, mp_context=context) if procs > 1 else _InProcess() as ex:
        for done, ((split, _), entry) in enumerate(zip(tasks, ex.map(write_shard_task, [t for _, t in tasks])), 1):
            written[split].append(entry)
            if time.monotonic() - last >= PROGRESS_S:
                last = time.monotonic()
                stderr_progress(f"data prepare: {done:,} of {len(tasks):,} shards written to {tmp.parent}")
    report = {"rows_read": pool.rows_read, "dropped": dict(pool.drops.counts),
              "dropped_examples": {k: list(v) for k, v in pool.drops.examples.items()}, "split_method": method,
              "manifest": pool.notes.get("manifest")}
    return write_index(tmp, {"task": "classification", "modality": "image", "classes": classes, **meta,
                             "report": report, "prepared_s": round(time.monotonic() - started, 3)}, written)


class _InProcess:
    """`ProcessPoolExecutor.map`'s shape for one worker: no pool to start."""

    def __enter__(self) -> "_InProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    map = staticmethod(map)


def _existing_index(out: Path) -> Optional[dict[str, Any]]:
    """The index of a prepared directory at `out`; None when `out` is missing or empty. UserError for a file or a
    directory holding anything else: it is never written to."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise UserError(f"--out: {out} is a file; choose a new or empty directory")
    try:
        index = json.loads((out / INDEX).read_text())
        if isinstance(index, dict) and index.get("format") == FORMAT:
            return index
    except (OSError, ValueError):
        pass
    if any(out.iterdir()):
        raise UserError(f"--out: {out} is not empty and holds no prepared shards; choose a new or empty directory")
    return None


def _me() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _clear_unfinished(out: Path) -> None:
    """Remove what a prepare that crashed on this machine left beside `out` (its process is gone)."""
    host = socket.gethostname()
    for left in out.parent.glob(f".{out.name}.*-{host}-*"):
        try:
            os.kill(int(left.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(left, ignore_errors=True)
        except (ValueError, PermissionError):
            continue


def _summary(out: Path, index: dict[str, Any], *, reused: bool) -> dict[str, Any]:
    shards = index["splits"]
    return {"directory": str(out), "reused": reused, "classes": len(index["classes"]),
            "shards": {s: len(shards[s]) for s in SPLITS}, "samples": {s: sum(e["samples"] for e in shards[s])
                                                                      for s in SPLITS},
            "bytes": sum(e["bytes"] for s in SPLITS for e in shards[s]), "shard_samples": index["prepared_with"]
            ["shard_samples"], "rows_read": index["report"]["rows_read"], "dropped": index["report"]["dropped"],
            "prepared_s": index["prepared_s"]}
