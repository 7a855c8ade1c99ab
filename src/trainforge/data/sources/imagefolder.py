"""`imagefolder`: a folder with one subfolder per class of image files.

The folder's scan is remembered in a manifest (`trainforge.data.formats.manifest`): the first run reads each file
once (SHA-256 for duplicates, the header, a decode only of files that may be cut short), later runs, resumes,
`plan`, tune trials and the job admission read again only files whose size or mtime changed. Exact duplicates
and files that do not open (or are cut short) are dropped and counted. Pixels are loaded lazily, per sample,
resized to image_size x image_size, as float32 in [0, 1] (under `data.normalize: model`: resized and cropped as
the pretrained model expects, image_size unused). A file that still fails to decode then is replaced by
another sample of its split (`SampleUnreadable`), recorded beside the manifest (from any process, DataLoader
workers included), counted in data_report.json at the end of the run, and dropped by the next run before
its split.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.image.preprocess import ImagePreprocess
from trainforge.data.image.read import read_image, read_model_image
from trainforge.data.formats.manifest import (CORRUPT, DECODE_FAILED, IMAGE_SUFFIXES, OK, FailureLog, folder_manifest,
                                              read_files)
from trainforge.data.pool import DROP_REASONS, MAX_DROP_EXAMPLES, DropLog, Pool, Samples, SampleUnreadable
from trainforge.data.sources.common import (INDEX_SUFFIXES, MISSING_GROUP, SOURCES, SourceArgs, class_names_for,
                                            group_reasons, label_text, no_group_column, parse_args, read_index,
                                            require_path, under_index)
from trainforge.hardware.cpus import available_cpus
from trainforge.errors import UserError

__all__ = ["IMAGE_SUFFIXES", "ImageFiles", "imagefolder", "load_image"]


def load_image(path: str, image_size: int, grayscale: bool) -> torch.Tensor:
    """float32 (C, S, S) in [0, 1]; C is 1 for grayscale, else 3."""
    return torch.from_numpy(read_image(path, image_size, grayscale))


class ImageFiles(Samples):
    """The kept image files: `paths[i]` (absolute), `ids[i]` (relative to the folder, as in the report),
    `stamps[i]` (size_bytes, mtime_ns when scanned). Sample i is decoded when asked for."""

    def __init__(self, root: str, ids: list[str], labels: np.ndarray, stamps: np.ndarray, image_size: int,
                 grayscale: bool, preprocess: Optional[ImagePreprocess] = None,
                 failures: Optional[FailureLog] = None) -> None:
        self.root, self.ids, self.labels, self.stamps = root, ids, labels, stamps
        self.paths = [f"{root}/{rel}" for rel in ids]
        self.image_size, self.grayscale, self.preprocess, self.failures = image_size, grayscale, preprocess, failures

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        path = self.paths[index]
        try:
            if self.preprocess is None:
                x = load_image(path, self.image_size, self.grayscale)
            else:
                x = torch.from_numpy(read_model_image(path, self.preprocess, self.grayscale))
        except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError ...) for bad files
            if self.failures is not None:
                size, mtime = (int(v) for v in self.stamps[index])
                self.failures.record(self.ids[index], size, mtime, f"{type(e).__name__}: {e}")
            raise SampleUnreadable(self.ids[index]) from e
        return x, torch.tensor(int(self.labels[index]))

    def _with(self, **changes: Any) -> "ImageFiles":
        fields = {"root": self.root, "ids": self.ids, "labels": self.labels, "stamps": self.stamps,
                  "image_size": self.image_size, "grayscale": self.grayscale, "preprocess": self.preprocess,
                  "failures": self.failures, **changes}
        return ImageFiles(**fields)

    def with_image_preprocess(self, preprocess: ImagePreprocess) -> "ImageFiles":
        """The same files, each read as the pretrained model expects (from the file, with Pillow, as predict does)."""
        return self._with(preprocess=preprocess)

    def subset(self, keep: np.ndarray) -> "ImageFiles":
        return self._with(ids=[self.ids[i] for i in keep], labels=self.labels[keep], stamps=self.stamps[keep])

    def runtime_failures(self) -> dict[str, Any]:
        """Files of this data that failed to decode at run time (in any process that recorded them), with examples."""
        failed = self.failures.failed() if self.failures is not None else {}
        hits = [rel for rel, (size, mtime) in zip(self.ids, self.stamps.tolist())
                if failed.get(rel) == (size, mtime)]
        return {"decode_failed": len(hits), "examples": hits[:MAX_DROP_EXAMPLES]}


def index_pool(cfg: DataConfig, a: "ImageFolderArgs", index: Path) -> Pool:
    """Images listed by an index (`path`, relative to it, and `label`, and any other columns: `data.group_by`). Each
    file is read once (SHA-256, header; the image-folder reader), not remembered in a manifest: dropped and counted
    as a folder's are (corrupt, duplicate), and a row without a path as corrupt, without a label as bad_label."""
    drops = DropLog(group_reasons(cfg, DROP_REASONS))
    rows, columns, not_rows = [], set(), 0
    for where, record in read_index(index, cfg):
        if record is None or not isinstance(record.get("path"), str) or not record["path"].strip():
            drops.drop("corrupt", f"{index.name} {where}")
            not_rows += 1
            continue
        columns.update(record)
        rows.append((where, record))
    if cfg.group_by is not None and rows and cfg.group_by not in columns:
        raise no_group_column(cfg, index.name, sorted(columns))
    listed = []
    for where, record in rows:
        label = label_text(record.get("label"))
        if label is None:
            drops.drop("bad_label", f"{index.name} {where}")
            continue
        group = None
        if cfg.group_by is not None:
            group = label_text(record.get(cfg.group_by))
            if group is None:
                drops.drop(MISSING_GROUP, f"{index.name} {where}")
                continue
        rel = record["path"].strip()
        listed.append((rel, str(under_index(index, rel, where)), label, group))
    reads = read_files([target for _, target, _, _ in listed], available_cpus())
    kept, seen = [], set()
    for (rel, target, label, group), (digest, _, _, _, _, verdict) in zip(listed, reads):
        if verdict != OK or not digest:
            drops.drop("corrupt", rel)
            continue
        if cfg.clean.dedup and digest in seen:
            drops.drop("duplicate", rel)
            continue
        seen.add(digest)
        st = os.stat(target)
        kept.append((rel, label, group, (st.st_size, st.st_mtime_ns)))
    names = class_names_for([label for _, label, _, _ in kept], None)
    if len(names) < 2:
        raise UserError(f"data.path: {index.name} lists {len(names)} class(es) among its readable images; need at "
                        "least 2", public=True)
    lookup = {name: i for i, name in enumerate(names)}
    labels = np.asarray([lookup[label] for _, label, _, _ in kept], dtype=np.int64)
    stamps = np.asarray([s for _, _, _, s in kept], dtype=np.int64).reshape(-1, 2)
    channels = 1 if a.grayscale else 3
    info = DataInfo("classification", "image", (channels, a.image_size, a.image_size), "float32", len(names),
                    tuple(names))
    samples = ImageFiles(str(index.parent), [rel for rel, _, _, _ in kept], labels, stamps, a.image_size, a.grayscale)
    return Pool(info, samples, labels=labels, rows_read=len(rows) + not_rows,
                drops=drops, preprocess={"image_size": a.image_size, "channels": channels, "grayscale": a.grayscale},
                notes={"index": index.name},
                groups=None if cfg.group_by is None else np.asarray([g for _, _, g, _ in kept], dtype=object))


class ImageFolderArgs(SourceArgs):
    image_size: int = Field(32, gt=0)
    grayscale: bool = False


@SOURCES.register("imagefolder")
def imagefolder(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: root/<class>/<image>; args image_size (32), grayscale (false)."""
    a = parse_args(ImageFolderArgs, cfg)
    root = require_path(cfg, "a folder with one subfolder of images per class, or an index (.csv, .jsonl, .parquet) "
                             "of path,label[,patient_id,...]")
    if root.is_file() and root.suffix.lower() in INDEX_SUFFIXES:
        return index_pool(cfg, a, root)
    if cfg.group_by is not None:
        raise no_group_column(cfg, f"the class folders of {root.name}", ["path", "label"])
    if not root.is_dir():
        raise UserError(f"data.path: {root} is a file; point it at a folder with one subfolder of images per class",
                        public=True)
    scan = folder_manifest(root)
    if len(scan.classes) < 2:
        raise UserError(f"data.path: {root} has {len(scan.classes)} class subfolder(s); need at least 2 (one per "
                        "class)", public=True)
    drops, seen = DropLog(), set()
    kept, failed_before = [], []
    for f in scan.files:
        if not f.sha256:  # unreadable (permissions, vanished): dropped like a file that does not decode
            drops.drop("corrupt", f.path)
            continue
        if cfg.clean.dedup and f.sha256 in seen:
            drops.drop("duplicate", f.path)
            continue
        seen.add(f.sha256)
        if f.verdict == CORRUPT:
            drops.drop("corrupt", f.path)
            continue
        assert f.verdict in (OK, DECODE_FAILED), f.verdict
        if f.verdict == DECODE_FAILED:  # an earlier run could not decode it: the pipeline drops it before the split
            failed_before.append(len(kept))
        kept.append(f)
    labels = np.asarray([f.label for f in kept], dtype=np.int64)
    stamps = np.asarray([(f.size_bytes, f.mtime_ns) for f in kept], dtype=np.int64).reshape(-1, 2)
    channels = 1 if a.grayscale else 3
    shape = (channels, a.image_size, a.image_size)
    info = DataInfo("classification", "image", shape, "float32", len(scan.classes), tuple(scan.classes))
    samples = ImageFiles(str(root), [f.path for f in kept], labels, stamps, a.image_size, a.grayscale,
                         failures=scan.failures)
    return Pool(
        info,
        samples,
        labels=labels,
        rows_read=len(scan.files),
        drops=drops,
        preprocess={"image_size": a.image_size, "channels": channels, "grayscale": a.grayscale},
        notes={"manifest": scan.report},
        failed_before=np.asarray(failed_before, dtype=np.int64),
    )
