"""`webdataset`: images from WebDataset tar shards that `trainforge data prepare --format webdataset` wrote.

data.path is the prepared directory (data/formats/tar_shards.py: shards, their sample indexes, index.json). Nothing is
scanned or listed at start: index.json says the splits, shards, classes and what the prepare dropped. The
splits are the ones the shards were written with; the train split's samples are dealt out shard by shard
(`ShardOrder`, data/stages/loader.py): each rank reads its own shards. Images are decoded when read, as `imagefolder`
does (image_size, grayscale; or the pretrained model's preprocessing). One that fails to decode is replaced by
another sample of its split and recorded (from any process) beside the folder manifests; data_report.json
counts it at the end of the run.
"""
from __future__ import annotations

import hashlib
import io
import os
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.image.preprocess import ImagePreprocess
from trainforge.data.image.read import read_image, read_model_image
from trainforge.data.formats.manifest import FailureLog, manifest_dir
from trainforge.data.pool import MAX_DROP_EXAMPLES, DropLog, Pool, Samples, SampleUnreadable
from trainforge.confine import check_found
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args, require_path
from trainforge.data.formats.tar_shards import INDEX, SPLITS, TarShards
from trainforge.errors import UserError


class ShardImages(Samples):
    """The images of a prepared directory (all splits); sample i is read from its shard and decoded when asked."""

    def __init__(self, tars: TarShards, image_size: int, grayscale: bool,
                 preprocess: Optional[ImagePreprocess] = None, failures: Optional[FailureLog] = None) -> None:
        self.tars, self.image_size, self.grayscale = tars, image_size, grayscale
        self.preprocess, self.failures = preprocess, failures

    def __len__(self) -> int:
        return len(self.tars)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        data, label, ident = self.tars.read(index)
        try:
            if self.preprocess is None:
                x = read_image(io.BytesIO(data), self.image_size, self.grayscale)
            else:
                x = read_model_image(io.BytesIO(data), self.preprocess, self.grayscale)
        except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError ...) for bad bytes
            if self.failures is not None:
                self.failures.record(ident, len(data), 0, f"{type(e).__name__}: {e}")
            raise SampleUnreadable(ident) from e
        return torch.from_numpy(x), torch.tensor(label)

    def with_image_preprocess(self, preprocess: ImagePreprocess) -> "ShardImages":
        return ShardImages(self.tars, self.image_size, self.grayscale, preprocess, self.failures)

    def runtime_failures(self) -> dict[str, Any]:
        """Samples that failed to decode at run time (in any process), with examples (`<shard>:<sample>`)."""
        hits = sorted(self.failures.failed()) if self.failures is not None else []
        return {"decode_failed": len(hits), "examples": hits[:MAX_DROP_EXAMPLES]}


class WebDatasetArgs(SourceArgs):
    image_size: int = Field(32, gt=0)
    grayscale: bool = False


def failure_log(root: Path) -> FailureLog:
    """Where run-time decode failures of this prepared directory (as it is now: index.json's mtime) are kept."""
    stamp = f"{os.path.realpath(root)}\0{(root / INDEX).stat().st_mtime_ns}"
    directory = manifest_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return FailureLog(directory / f"webdataset-{hashlib.sha256(stamp.encode()).hexdigest()[:32]}.failures.jsonl")


@SOURCES.register("webdataset")
def webdataset(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: a directory of `trainforge data prepare --format webdataset`; args image_size (32), grayscale."""
    a = parse_args(WebDatasetArgs, cfg)
    root = require_path(cfg, "a directory written by `trainforge data prepare RECIPE --format webdataset --out DIR`")
    check_found([root / INDEX], root, "data.path")
    tars = TarShards.open(root)
    check_found([Path(p) for s in tars.shards for p in (s.path, s.path[:-4] + ".idx.npy")], root, "data.path")
    tars.check("data.path")  # every index as trainforge writes it, before any sample is read
    index = tars.index
    kept = index["prepared_with"]
    if (cfg.val_fraction, cfg.test_fraction) != (kept["val_fraction"], kept["test_fraction"]):
        warnings.warn(f"data.val_fraction and data.test_fraction ignored: the shards in {root} keep the splits they "
                      f"were prepared with (val {kept['val_fraction']}, test {kept['test_fraction']})")
    splits = {name: np.arange(*tars.split_ranges[name], dtype=np.int64) for name in SPLITS}
    if len(splits["train"]) == 0:
        raise UserError(f"data.path: {root} has no train samples; prepare it again from a folder with images",
                        public=True)
    classes = tuple(index["classes"])
    counts = {name: np.sum([s["class_counts"] for s in index["splits"].get(name, [])] or [[0] * len(classes)], axis=0)
              for name in SPLITS}
    drops = DropLog()
    for reason, n in index["report"]["dropped"].items():
        drops.counts[reason] = int(n)
    drops.examples = {k: list(v) for k, v in index["report"]["dropped_examples"].items()}
    channels = 1 if a.grayscale else 3
    info = DataInfo("classification", "image", (channels, a.image_size, a.image_size), "float32", len(classes),
                    classes)
    notes = {
        "class_counts": {name: dict(zip(classes, (int(c) for c in counts[name]))) for name in SPLITS},
        "webdataset": {"directory": str(root), "shards": {name: len(index["splits"].get(name, [])) for name in SPLITS},
                       "bytes": sum(s["bytes"] for name in SPLITS for s in index["splits"].get(name, [])),
                       "prepared_from": index["source"], "prepared_with": kept},
    }
    return Pool(
        info,
        ShardImages(tars, a.image_size, a.grayscale, failures=failure_log(root)),
        labels=None,
        rows_read=int(index["report"]["rows_read"]),
        drops=drops,
        preprocess={"image_size": a.image_size, "channels": channels, "grayscale": a.grayscale},
        notes=notes,
        splits=splits,
        train_shards=tars.shard_sizes("train"),
    )
