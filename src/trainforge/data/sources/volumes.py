"""`volumes`: CT/MRI volumes, NIfTI files (`.nii`, `.nii.gz`) and DICOM series (a folder of one file per slice), for
classification of a whole volume.

data.path is a folder with one subfolder per class (each holding volumes), or an index (`.csv`, `.jsonl`, `.parquet`) whose rows
give `path` (relative to the index's folder, never outside it) and `label`, and any other columns (`patient_id`:
`data.group_by` keeps a patient's volumes in one split).

Read with MONAI's readers (NibabelReader, PydicomReader: the slices sorted by position, the rescale to Hounsfield units
applied, DICOM's LPS geometry turned into RAS) and prepared with MONAI's transforms, in this order: reorientation
(`orientation`, RAS by default), resampling to `spacing` (mm, bilinear), intensity windowing in HU (`window`:
{center, width} or a preset: values below the window 0, above it 1, linear between), crop or pad about the centre
to `size` (D, H, W... in the volume's RAS axes). A sample is float32 (1, *size) and its class.

Each volume is read and checked once when the data is built; what it became is cached under
`$TRAINFORGE_HOME/volumes/` keyed by its files (path, size, mtime) and the preprocessing settings, so a second run,
a resume, `plan` or a DDP rank decodes no volume (data_report.json `volume_cache`: decoded, cached). Dropped and
counted (data_report.json `dropped`, and the console): unreadable (not a volume the readers can decode: a cut
.nii.gz, a PNG named .nii), bad_slices (a DICOM series with a slice missing, slices of other series, sizes or
orientations mixed), no_geometry (spacing or orientation that cannot be read), not_3d (a NIfTI with a fourth axis
of more than one: a time series, channels), too_large (its header's voxels, or the voxels resampling to `spacing`
would make, beyond `max_volume_voxels`: decided from the header, before any voxel is allocated),
duplicate_series (a SeriesInstanceUID seen in an earlier series), duplicate (a volume of the same voxels as an earlier one; data.clean.dedup),
missing_label (no label, or one not in data.args.classes) and missing_group (data.group_by set, the value empty).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Literal, Optional, Union

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.data.pool import DropLog, Pool, Samples, SampleUnreadable
from trainforge.data.sources.common import (INDEX_SUFFIXES, MISSING_GROUP, SOURCES, SourceArgs, class_names_for,
                                            group_reasons, label_notes, label_text, no_group_column, parse_args,
                                            read_index, require_path, under_index)
from trainforge.errors import UserError
from trainforge.files import trainforge_home, write_json_atomic, write_text_atomic

WHAT = ("a folder with one subfolder of volumes (.nii, .nii.gz, DICOM series folders) per class, or an index "
        "(.csv, .jsonl, .parquet) of path,label[,patient_id,...]")
REASONS = ("unreadable", "bad_slices", "no_geometry", "not_3d", "too_large", "duplicate_series", "duplicate",
           "missing_label")
# a volume's voxels as stored, and after resampling to data.args.spacing: 2**28 is 1 GiB as float32 (a 512 x 512 x
# 1000 CT fits); reading and resampling one takes a few times that at its peak
DEFAULT_MAX_VOLUME_VOXELS = 2**28
NIFTI_SUFFIXES = (".nii", ".nii.gz")
CACHE_VERSION = 2
# HU windows (center, width) radiologists read CT with
WINDOW_PRESETS: dict[str, tuple[float, float]] = {
    "lung": (-600.0, 1500.0), "soft_tissue": (40.0, 400.0), "bone": (400.0, 1800.0), "brain": (40.0, 80.0),
}
SEGMENTATION_REASONS = ("missing_mask", "unreadable_mask", "size_mismatch")  # with data.args.mask_column
SLICE_GAP_TOLERANCE = 0.2  # slice positions more than 20% off the series' steady step: a slice is missing


class Window(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    center: float
    width: float


class VolumeArgs(SourceArgs):
    classes: Optional[list[Union[str, int]]] = None
    size: list[int] = Field(default_factory=lambda: [64, 64, 64], min_length=3, max_length=3)
    spacing: Optional[list[float]] = Field(None, min_length=3, max_length=3)  # mm per voxel after resampling
    orientation: Optional[Literal["RAS", "LPS", "LAS", "RPS"]] = "RAS"
    window: Optional[Union[str, Window]] = None  # a preset name or {center, width} in HU
    path_column: str = "path"
    label_column: str = "label"
    # 3D segmentation: the index column naming each volume's label volume (NIfTI of class indices, the same grid);
    # classes then names the values 0, 1, ... (background first)
    mask_column: Optional[str] = None
    # 3D segmentation: train on random crops of this size (D, H, W; a foreground voxel at the centre half the time);
    # validation, test and predict take the whole volume (`size`) by sliding the model over it
    patch: Optional[list[int]] = Field(None, min_length=3, max_length=3)
    # a volume whose header says it holds more voxels, or would after resampling to `spacing`, is dropped (too_large)
    # before anything is allocated: an 86-byte file may claim gigabytes
    max_volume_voxels: int = Field(DEFAULT_MAX_VOLUME_VOXELS, ge=1)

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, str):
            if v not in WINDOW_PRESETS:
                raise ValueError(f"choose a preset ({', '.join(WINDOW_PRESETS)}) or give {{center, width}} in HU")
            return v
        if not isinstance(v, dict) or set(v) != {"center", "width"}:
            raise ValueError("give {center, width} in HU, or a preset name")
        window = Window.model_validate(v)
        if not window.width > 0:
            raise ValueError("the width must be above 0 HU (a window of no width maps every voxel to 0 or 1)")
        return window

    def model_post_init(self, _: Any) -> None:
        if any(not 1 <= s <= 1024 for s in self.size):
            raise UserError(f"data.args.size: each of the 3 sizes must be 1..1024 voxels, got {self.size}", public=True)
        if self.patch is not None and (self.mask_column is None or any(
                not 1 <= p <= s for p, s in zip(self.patch, self.size))):
            raise UserError(f"data.args.patch: a training crop for 3D segmentation (data.args.mask_column), each side "
                            f"1..its data.args.size {self.size}; got {self.patch}", public=True)
        if self.spacing is not None and any(not (0 < s <= 100) for s in self.spacing):
            raise UserError(f"data.args.spacing: each spacing must be above 0 and at most 100 mm, got {self.spacing}",
                            public=True)

    def window_range(self) -> Optional[tuple[float, float]]:
        """(lowest, highest) HU of the window, or None."""
        if self.window is None:
            return None
        center, width = (WINDOW_PRESETS[self.window] if isinstance(self.window, str)
                         else (self.window.center, self.window.width))
        return center - width / 2, center + width / 2

    def settings(self) -> dict[str, Any]:
        """What the prepared voxels depend on (the cache key, the stored preprocessing)."""
        return {"size": list(self.size), "spacing": self.spacing, "orientation": self.orientation,
                "window": None if self.window_range() is None else list(self.window_range()),
                "max_volume_voxels": self.max_volume_voxels}


# ---- reading (MONAI) and the checks MONAI's readers do not make
@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """MONAI and pydicom warn about optional codecs and deprecations on every read: not the user's business."""
    loggers = [logging.getLogger(name) for name in ("monai", "pydicom")]
    levels = [log.level for log in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for log in loggers:
            log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for log, level in zip(loggers, levels):
                log.setLevel(level)


def window_hu(x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """HU -> [0, 1] over the window [low, high], clipped (MONAI's ScaleIntensityRange)."""
    from monai.transforms import ScaleIntensityRange

    return ScaleIntensityRange(a_min=low, a_max=high, b_min=0.0, b_max=1.0, clip=True)(x)


def prepare_volume(path: str, settings: dict[str, Any], *, mask: bool = False,
                   shape: Optional[list[int]] = None) -> np.ndarray:
    """A NIfTI file or a DICOM series folder read and prepared as `settings` say: float32 (1, *size). `mask`: a
    label volume (class indices): resampled nearest-neighbour, never windowed, int16 (*size). `shape`: the spatial
    shape the file must have before preparation (a mask: its image's), else ValueError "size"."""
    from monai.transforms import LoadImage, Orientation, ResizeWithPadOrCrop, Spacing

    reader = "PydicomReader" if os.path.isdir(path) else "NibabelReader"
    if not os.path.isdir(path):  # a file handed to `predict` has had no check: its header first
        verdict = check_nifti(path, settings, geometry=False)
        if verdict is not None:
            raise ValueError(verdict)
    with _quiet():
        x = LoadImage(reader=reader, image_only=True, ensure_channel_first=True, dtype=np.float32)(path)
        if x.ndim != 4:
            raise ValueError(f"a {x.ndim - 1}-D image, not a volume")
        if shape is not None and list(x.shape[1:]) != list(shape):
            raise ValueError("size")
        if settings["orientation"]:
            x = Orientation(settings["orientation"])(x)
        if settings["spacing"]:
            x = Spacing(pixdim=settings["spacing"], mode="nearest" if mask else "bilinear")(x)
        if settings["window"] and not mask:
            x = window_hu(x, *settings["window"])
        x = ResizeWithPadOrCrop(settings["size"])(x)
    out = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    if mask:
        return np.ascontiguousarray(np.rint(out[0]), dtype=np.int16)
    return np.ascontiguousarray(out, dtype=np.float32)


def raw_shape(path: str) -> list[int]:
    """The spatial shape of a NIfTI file or a DICOM series as stored (before any preparation)."""
    if os.path.isdir(path):
        import pydicom

        files = files_of(path)
        with _quiet():
            head = pydicom.dcmread(files[0], stop_before_pixels=True)
        return [int(head.Columns), int(head.Rows), len(files)]  # MONAI's (x, y, z) of a series
    import nibabel as nib

    with _quiet():
        return [int(v) for v in nib.load(path).shape[:3]]


def check_nifti(path: str, settings: Optional[dict[str, Any]] = None, *, geometry: bool = True) -> Optional[str]:
    """None, or the drop reason of a NIfTI file whose header cannot be used (unreadable; with `geometry`, no_geometry),
    whose volume is not 3-D (not_3d) or would not fit `settings`' max_volume_voxels (too_large). Only the header is
    read. `geometry=False`: a label volume, whose geometry is its image's."""
    import nibabel as nib

    try:
        with _quiet():
            img = nib.load(path)  # the header only: nibabel reads the voxels when asked for them
            shape = tuple(int(v) for v in img.shape)
            affine, zooms = img.affine, [float(z) for z in img.header.get_zooms()[:3]]
            codes = (int(img.header["qform_code"]), int(img.header["sform_code"]))
    except Exception:  # nibabel raises many types for a file that is not NIfTI
        return "unreadable"
    if len(shape) < 3 or min(shape) < 1:
        return "unreadable"
    if len(shape) > 3 and int(np.prod(shape[3:])) > 1:
        return "not_3d"
    usable = np.all(np.isfinite(zooms)) and min(zooms) > 0
    # neither a qform nor an sform: nibabel falls back to a made-up orientation, not the scanner's
    if geometry and (codes == (0, 0) or not np.all(np.isfinite(affine)) or abs(np.linalg.det(affine[:3, :3])) < 1e-9
                     or not usable):
        return "no_geometry"
    return size_verdict(shape[:3], zooms if usable else [1.0, 1.0, 1.0], settings)


def size_verdict(shape: Any, zooms: Any, settings: Optional[dict[str, Any]]) -> Optional[str]:
    """too_large when a volume of `shape` voxels of `zooms` mm holds, or resampled to settings' spacing would hold,
    more than settings' max_volume_voxels; else None. Arithmetic on the header only (Python ints: no overflow)."""
    settings = settings or {}
    limit = int(settings.get("max_volume_voxels") or DEFAULT_MAX_VOLUME_VOXELS)
    raw = 1
    for n in shape:
        raw *= int(n)
    if raw > limit:
        return "too_large"
    spacing = settings.get("spacing")
    if spacing:
        resampled = 1.0
        for n, zoom, target in zip(shape, zooms, spacing):
            resampled *= max(1.0, int(n) * float(zoom) / float(target))
        if resampled > limit:
            return "too_large"
    return None


def check_series(folder: str, settings: Optional[dict[str, Any]] = None) -> tuple[Optional[str], Optional[str]]:
    """(the drop reason or None, the SeriesInstanceUID) of a DICOM series folder: every file a slice of one series,
    of one size and orientation, at evenly spaced positions (a gap is a missing slice), and its voxels, as stored and
    resampled, within `settings`' max_volume_voxels (too_large)."""
    import pydicom

    files = files_of(folder)
    real = os.path.realpath(folder)
    if not files or any(os.path.commonpath([real, os.path.realpath(f)]) != real for f in files):
        return "unreadable", None  # empty, or a link to a file outside the series' folder: nothing of it is read
    heads = []
    for f in files:
        try:
            with _quiet():
                heads.append(pydicom.dcmread(f, stop_before_pixels=True))
        except Exception:  # pydicom raises many types for a file that is not DICOM
            return "unreadable", None
    uids = {str(getattr(h, "SeriesInstanceUID", "")) for h in heads}
    uid = uids.pop() if len(uids) == 1 else None
    try:
        orient = {tuple(round(float(v), 4) for v in h.ImageOrientationPatient) for h in heads}
        positions = [np.asarray([float(v) for v in h.ImagePositionPatient]) for h in heads]
        spacing = [float(v) for v in heads[0].PixelSpacing]
        sizes = {(int(h.Rows), int(h.Columns)) for h in heads}
    except (AttributeError, TypeError, ValueError):
        return "no_geometry", uid
    if uid is None or len(orient) != 1 or len(sizes) != 1:
        return "bad_slices", uid
    if min(spacing) <= 0 or len(heads) < 2:
        return "no_geometry", uid
    row, col = np.asarray(next(iter(orient))[:3]), np.asarray(next(iter(orient))[3:])
    along = np.sort([float(p @ np.cross(row, col)) for p in positions])
    steps = np.diff(along)
    step = float(np.median(steps))
    if step <= 0 or np.any(np.abs(steps - step) > SLICE_GAP_TOLERANCE * step):
        return "bad_slices", uid
    rows, columns = next(iter(sizes))
    if not np.isfinite(spacing).all() or not np.isfinite(step):
        return "no_geometry", uid
    return size_verdict((columns, rows, len(heads)), (spacing[1], spacing[0], step), settings), uid


# ---- the cache of prepared volumes
def cache_dir() -> Path:
    return trainforge_home() / "volumes"


def files_of(path: str) -> list[str]:
    """The files a volume is read from: the file, or a series folder's files (not hidden), sorted."""
    if os.path.isdir(path):
        return [os.path.join(path, f) for f in sorted(os.listdir(path))
                if not f.startswith(".") and os.path.isfile(os.path.join(path, f))]
    return [path]


def cache_key(path: str, settings: dict[str, Any]) -> str:
    stamps = []
    for f in files_of(path):
        st = os.stat(f)
        stamps.append([os.path.realpath(f), st.st_size, st.st_mtime_ns])
    doc = json.dumps({"v": CACHE_VERSION, "files": stamps, "settings": settings}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()


class Prepared:
    """What the cache holds of one volume: the verdict (None = kept, else the drop reason), its SeriesInstanceUID,
    the SHA-256 of its prepared voxels (duplicates) and where they are."""

    def __init__(self, key: str, verdict: Optional[str], uid: Optional[str], digest: Optional[str]) -> None:
        self.key, self.verdict, self.uid, self.digest = key, verdict, uid, digest

    @property
    def voxels_path(self) -> str:
        return str(cache_dir() / f"{self.key}.npy")

    @property
    def mask_path(self) -> str:
        return str(cache_dir() / f"{self.key}.mask.npy")


def prepared(path: str, settings: dict[str, Any], counts: Counter[str], mask: Optional[str] = None) -> Prepared:
    """The volume at `path` (and its label volume `mask`) checked and prepared: from the cache, else read now
    (counted as decoded) and cached. A mask that cannot be read is unreadable, one of another size than its
    volume size_mismatch; its values are checked by the caller (`mask_values`)."""
    try:
        key = cache_key(path, settings)
        if mask is not None:
            key = hashlib.sha256((key + cache_key(mask, {**settings, "mask": True})).encode()).hexdigest()
    except OSError:
        return Prepared("", "unreadable", None, None)
    facts = cache_dir() / f"{key}.json"
    try:
        doc = json.loads(facts.read_text())
        hit = Prepared(key, doc["verdict"], doc["uid"], doc["digest"])
        if hit.verdict is not None or (os.path.isfile(hit.voxels_path)
                                       and (mask is None or os.path.isfile(hit.mask_path))):
            counts["cached"] += 1
            return hit
    except (OSError, ValueError, KeyError, TypeError):
        pass
    counts["decoded"] += 1
    verdict, uid = check_series(path, settings) if os.path.isdir(path) else (check_nifti(path, settings), None)
    digest = None
    if verdict is None:
        try:
            voxels = prepare_volume(path, settings)
        except Exception:  # MONAI / nibabel / pydicom raise many types for a volume they cannot read
            verdict = "unreadable"
    if verdict is None and mask is not None:
        try:
            labels = prepare_volume(mask, settings, mask=True, shape=raw_shape(path))
        except Exception as e:  # likewise for the label volume
            verdict = "size_mismatch" if str(e) == "size" else "unreadable_mask"
        else:
            _save(Path(Prepared(key, None, None, None).mask_path), labels)
    if verdict is None:
        digest = hashlib.sha256(voxels.tobytes()).hexdigest()
        _save(cache_dir() / f"{key}.npy", voxels)
    facts.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(facts, {"verdict": verdict, "uid": uid, "digest": digest})
    return Prepared(key, verdict, uid, digest)


def _save(path: Path, array: np.ndarray) -> None:
    """An array as .npy, atomically (a reader, another rank, never sees half a file)."""
    buf = io.BytesIO()
    np.save(buf, array)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, buf.getvalue())


# ---- the entries: a class-folder tree or an index
class Entry:
    def __init__(self, ident: str, path: str, record: dict[str, Any]) -> None:
        self.ident, self.path, self.record = ident, path, record


def is_volume(p: Path) -> bool:
    return p.is_dir() or p.name.lower().endswith(NIFTI_SUFFIXES)


def folder_entries(root: Path, a: VolumeArgs, drops: Optional[DropLog] = None) -> list[Entry]:
    """A volume per item of each class folder. A class folder or an item that is a link leading out of the data folder
    is never read (dropped as unreadable): a folder names what is in it, as an index names what is below it."""
    real_root = os.path.realpath(root)

    def inside(p: Path) -> bool:
        return os.path.commonpath([real_root, os.path.realpath(p)]) == real_root

    entries = []
    for cls in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if not inside(cls):
            if drops is not None:
                drops.drop("unreadable", cls.name)
            continue
        for item in sorted(p for p in cls.iterdir() if not p.name.startswith(".") and is_volume(p)):
            rel = item.relative_to(root).as_posix()
            if not inside(item):
                if drops is not None:
                    drops.drop("unreadable", rel)
                continue
            entries.append(Entry(rel, str(item), {a.label_column: cls.name}))
    return entries


def index_entries(index: Path, a: VolumeArgs, drops: DropLog, cfg: Optional[DataConfig] = None
                  ) -> tuple[list[Entry], set[str]]:
    """The index's rows as entries (paths resolved under the index's folder; a row that is no record: unreadable),
    and every column seen."""
    entries, columns = [], set()
    for where, record in read_index(index, cfg):
        if record is None or not isinstance(record.get(a.path_column), str) or not record[a.path_column].strip():
            drops.drop("unreadable", f"{index.name} {where}")
            continue
        columns.update(record)
        rel = record[a.path_column].strip()
        entries.append(Entry(rel, str(under_index(index, rel, where)), record))
    return entries, columns


class VolumeSamples(Samples):
    """The kept volumes: sample i is its prepared voxels (read from the cache) and its class, or, for segmentation
    (`masks`), its prepared label volume: int64 (D, H, W) of class indices."""

    def __init__(self, ids: list[str], voxels: list[str], labels: np.ndarray,
                 masks: Optional[list[str]] = None, patch: Optional[tuple[int, int, int]] = None) -> None:
        self.ids, self.voxels, self.labels, self.masks, self.patch = ids, voxels, labels, masks, patch
        self.crops = patch is not None  # the train split is read as patches (the pipeline asks)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            x = np.load(self.voxels[index])
            y = (torch.tensor(int(self.labels[index])) if self.masks is None
                 else torch.from_numpy(np.load(self.masks[index]).astype(np.int64)))
        except (OSError, ValueError) as e:  # the cache was cleared under a running job
            raise SampleUnreadable(f"{self.ids[index]} (its prepared voxels: {e})") from e
        return torch.from_numpy(x), y

    def target_augment(self, augment: Any) -> Any:
        from trainforge.data.stages.augment import VolumeMaskAugment

        if self.masks is None:
            return augment
        return VolumeMaskAugment(augment, self.patch)  # the mask is cropped and flipped with the volume

    def subset(self, keep: np.ndarray) -> "VolumeSamples":
        return VolumeSamples([self.ids[i] for i in keep], [self.voxels[i] for i in keep], self.labels[keep],
                             None if self.masks is None else [self.masks[i] for i in keep], self.patch)


def say_progress(done: int, total: int, decoded: int) -> None:
    import sys

    print(f"volumes: {done}/{total} read ({decoded} decoded, the rest from the cache)", file=sys.stderr, flush=True)


PROGRESS_EVERY = 50


@SOURCES.register("volumes")
def volumes(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: class folders of volumes or an index; args classes, size, spacing, orientation, window."""
    a = parse_args(VolumeArgs, cfg)
    root = require_path(cfg, WHAT)
    if cfg.normalize == "model":
        raise UserError("data.normalize: 'model' is for 2D images; a volume is scaled by data.args.window (HU) and "
                        "then zscore, minmax or none", public=True)
    segmenting = a.mask_column is not None
    if segmenting and (not a.classes or len(a.classes) < 2):
        raise UserError("data.args.classes: 3D segmentation (data.args.mask_column) needs the name of each mask value, "
                        "background first, e.g. [background, tumour]", public=True)
    drops = DropLog(group_reasons(cfg, REASONS + (SEGMENTATION_REASONS if segmenting else ())))
    if segmenting and root.is_dir():
        raise UserError(f"data.path: {root.name} is a folder; 3D segmentation reads an index (.csv, .jsonl, .parquet) "
                        f"with columns {a.path_column} and {a.mask_column}", public=True)
    if root.is_dir():
        entries, columns = folder_entries(root, a, drops), {a.path_column, a.label_column}
        if cfg.group_by is not None:
            raise no_group_column(cfg, f"the class folders of {root.name}", sorted(columns))
    elif root.name.lower().endswith(INDEX_SUFFIXES):
        entries, columns = index_entries(root, a, drops, cfg)
        if cfg.group_by is not None and cfg.group_by not in columns:
            raise no_group_column(cfg, root.name, sorted(columns))
    else:
        raise UserError(f"data.path: {root.name} is neither a folder nor an index (.csv, .jsonl, .parquet); point it "
                        f"at {WHAT}",
                        public=True)
    if not entries and not drops.total:
        raise UserError(f"data.path: {root} holds no volumes; point it at {WHAT}", public=True)
    if segmenting and entries and a.mask_column not in columns:
        raise UserError(f"data.args.mask_column: {root.name} has no column {a.mask_column!r} (columns: "
                        f"{', '.join(sorted(columns))}); name the column of the label volumes", public=True)
    not_entries = drops.total  # index rows that were no records
    declared = class_names_for([], a.classes) if a.classes else None
    settings = a.settings()
    counts: Counter[str] = Counter(decoded=0, cached=0)
    seen_uids: set[str] = set()
    seen_digests: set[str] = set()
    unknown: Counter[str] = Counter()
    ids, voxels, labels, groups, masks = [], [], [], [], []
    voxels_per_class = np.zeros(len(declared or ()), dtype=np.int64)
    for n, e in enumerate(entries, start=1):
        if n % PROGRESS_EVERY == 0:
            say_progress(n, len(entries), counts["decoded"])
        mask = None
        if segmenting:
            label = ""
            rel = label_text(e.record.get(a.mask_column))
            mask = None if rel is None else str(under_index(root, rel, e.ident))
            if mask is None or not os.path.exists(mask):
                drops.drop("missing_mask", e.ident)
                continue
        else:
            label = label_text(e.record.get(a.label_column))
            if label is None or (declared is not None and label not in declared):
                drops.drop("missing_label", e.ident)
                if label is not None:
                    unknown[label] += 1
                continue
        group = None
        if cfg.group_by is not None:
            group = label_text(e.record.get(cfg.group_by))
            if group is None:
                drops.drop(MISSING_GROUP, e.ident)
                continue
        if not os.path.exists(e.path) or not is_volume(Path(e.path)):
            drops.drop("unreadable", e.ident)
            continue
        p = prepared(e.path, settings, counts, mask)
        if p.verdict is not None:
            drops.drop(p.verdict, e.ident)
            continue
        if segmenting:
            voxels_per_class += mask_values(p.mask_path, str(mask), len(voxels_per_class))
        if p.uid is not None and p.uid in seen_uids:
            drops.drop("duplicate_series", e.ident)
            continue
        if cfg.clean.dedup and p.digest in seen_digests:
            drops.drop("duplicate", e.ident)
            continue
        if p.uid is not None:
            seen_uids.add(p.uid)
        seen_digests.add(p.digest)
        ids.append(e.ident)
        voxels.append(p.voxels_path)
        labels.append(label)
        groups.append(group)
        masks.append(p.mask_path)
    if len(entries) >= PROGRESS_EVERY:
        say_progress(len(entries), len(entries), counts["decoded"])
    notes = {"volume_cache": {**counts, "dir": str(cache_dir())}, "volume_preprocess": settings}
    group_array = None if cfg.group_by is None else np.asarray(groups, dtype=object)
    if segmenting:
        assert declared is not None
        patch = None if a.patch is None else (a.patch[0], a.patch[1], a.patch[2])
        info = DataInfo("segmentation", "volume", (1, *(patch or a.size)), "float32", len(declared), tuple(declared))
        notes["voxels_per_class"] = {name: int(c) for name, c in zip(declared, voxels_per_class)}
        samples = VolumeSamples(ids, voxels, np.zeros(len(ids), dtype=np.int64), masks, patch)
        return Pool(info, samples, labels=None, rows_read=len(entries) + not_entries, drops=drops,
                    preprocess={"volume": settings, "patch": None if patch is None else list(patch)}, notes=notes,
                    groups=group_array)
    names = class_names_for(labels, declared)
    index = {name: i for i, name in enumerate(names)}
    y = np.asarray([index[label] for label in labels], dtype=np.int64)
    info = DataInfo("classification", "volume", (1, *a.size), "float32", len(names), tuple(names))
    return Pool(info, VolumeSamples(ids, voxels, y), labels=y, rows_read=len(entries) + not_entries, drops=drops,
                preprocess={"volume": settings}, notes={**label_notes(declared, unknown), **notes},
                groups=group_array)


def mask_values(prepared_mask: str, name: str, classes: int) -> np.ndarray:
    """Voxels of each class in a prepared label volume; a value that is no class is one line naming the file."""
    values = np.load(prepared_mask).reshape(-1).astype(np.int64)
    counts = np.bincount(np.clip(values, 0, None), minlength=classes)
    if values.min(initial=0) < 0 or len(counts) > classes:
        beyond = sorted(set(np.unique(values).tolist()) - set(range(classes)))
        raise UserError(f"{name}: values {', '.join(map(str, beyond[:5]))} are no class of the {classes} in "
                        f"data.args.classes (0..{classes - 1}); list every class, or fix the label volume",
                        public=True)
    return counts
