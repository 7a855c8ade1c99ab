"""data.source: volumes: NIfTI and DICOM series read with MONAI to the same voxels, HU windowing, every cleaning
reason counted on planted defects, the cache (a second build decodes nothing), patient-level splits, bad input."""
from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import numpy as np
import torch
import pytest

from tests.data.data_helpers import data_cfg
from tests.volume_data import (nibabel_example_4d, shape_volume, write_dicom_series, write_header_only_nifti,
                               write_nifti)
from trainforge.data import build_data
from trainforge.errors import UserError

SPACING = (0.8, 0.9, 1.5)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path / "home"))


def write_index(root: Path, rows: list[tuple[str, str, str]], name: str = "index.csv") -> Path:
    index = root / name
    index.write_text("path,label,patient_id\n" + "".join(f"{p},{y},{g}\n" for p, y, g in rows))
    return index


def volumes_cfg(path: Path, **args):
    extra = {k: args.pop(k) for k in ("group_by", "val_fraction", "test_fraction") if k in args}
    return data_cfg("volumes", path=str(path), normalize="none", args=args, **extra)


def all_samples(bundle):
    """{sample id: (voxels, label)} over the three splits, unaugmented."""
    out = {}
    for name in ("train", "val", "test"):
        ds = getattr(bundle, name)
        for i in range(len(ds)):
            out[ds.samples.ids[int(ds.indices[i])]] = (ds[i] if name != "train" else ds[i])
    return out


def test_nifti_and_a_dicom_series_of_one_volume_give_the_same_voxels_after_resampling(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    rows = []
    for i in range(3):
        hu = shape_volume("cube" if i % 2 else "sphere", rng, size=20)
        write_nifti(root / f"v{i}.nii.gz", hu, SPACING)
        write_dicom_series(root / f"v{i}_dicom", hu, SPACING, patient_id=f"P{i}")
        rows += [(f"v{i}.nii.gz", str(i % 2), f"P{i}"), (f"v{i}_dicom", str(i % 2), f"P{i}")]
    index = write_index(root, rows)
    cfg = volumes_cfg(index, size=[18, 16, 24], spacing=[1.2, 1.1, 1.3], val_fraction=0.2, test_fraction=0.2)
    cfg.clean.dedup = False  # the pairs are the same voxels: that is the point here
    samples = all_samples(build_data(cfg, seed=0))
    assert len(samples) == 6
    for i in range(3):
        nifti, dicom = samples[f"v{i}.nii.gz"][0], samples[f"v{i}_dicom"][0]
        assert nifti.shape == (1, 18, 16, 24)
        assert float(nifti.max()) > 200  # HU: the shape (300 HU) is in the crop, not only padding
        # a NIfTI header holds the spacing in float32 (0.8 mm is 0.800000012), DICOM as text: resampled to another
        # grid the two differ by that rounding only, ~1e-4 HU
        assert float((nifti - dicom).abs().max()) < 0.01


def test_hu_windowing_is_the_direct_numpy_computation_exactly(tmp_path):
    rng = np.random.default_rng(1)
    hu = shape_volume("sphere", rng, size=16, noise_hu=400)  # spans the whole lung window and beyond
    import nibabel as nib

    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    nib.save(nib.Nifti1Image(hu, np.diag([1.0, 1.0, 1.0, 1.0])), str(root / "a" / "x.nii.gz"))  # RAS already
    write_nifti(root / "b" / "y.nii.gz", shape_volume("cube", rng, size=16), (1.0, 1.0, 1.0))
    for window, (lo, hi) in (("lung", (-1350.0, 150.0)), ({"center": 35, "width": 351}, (-140.5, 210.5))):
        bundle = build_data(volumes_cfg(root, size=[16, 16, 16], window=window, val_fraction=0.0, test_fraction=0.0),
                            seed=0)
        x = all_samples(bundle)["a/x.nii.gz"][0].numpy()[0]
        expected = np.clip((hu.astype(np.float32) - np.float32(lo)) / np.float32(hi - lo), 0, 1)
        assert np.array_equal(x, expected), window
        assert (expected == 1).any() and (0 < expected).any() and ((expected == 0).any() or window == "lung")


def plant_defects(root: Path, rng) -> list[tuple[str, str, str]]:
    """A good volume per class and one of each defect; returns index rows."""
    import nibabel as nib

    rows = []
    for k in range(4):
        write_nifti(root / f"good{k}.nii.gz", shape_volume(("sphere", "cube")[k % 2], rng, size=12), SPACING)
        rows.append((f"good{k}.nii.gz", ("sphere", "cube")[k % 2], f"P{k}"))
    write_dicom_series(root / "series_ok", shape_volume("cube", rng, size=12), SPACING, patient_id="P5",
                       series_uid="1.2.3.4.5")
    rows.append(("series_ok", "cube", "P5"))
    # a truncated .nii.gz
    data = (root / "good0.nii.gz").read_bytes()
    (root / "cut.nii.gz").write_bytes(data[: len(data) // 2])
    rows.append(("cut.nii.gz", "sphere", "P6"))
    # a PNG named .nii
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), np.uint8)).save(root / "photo.png")
    shutil.copy(root / "photo.png", root / "photo.nii")
    rows.append(("photo.nii", "sphere", "P6"))
    # a DICOM series with a slice missing
    write_dicom_series(root / "series_gap", shape_volume("cube", rng, size=12), SPACING, patient_id="P7",
                       skip_slices=(5,))
    rows.append(("series_gap", "cube", "P7"))
    # a series whose SeriesInstanceUID an earlier series has
    write_dicom_series(root / "series_again", shape_volume("sphere", rng, size=12), SPACING, patient_id="P8",
                       series_uid="1.2.3.4.5")
    rows.append(("series_again", "sphere", "P8"))
    # a NIfTI whose orientation cannot be read: neither qform nor sform (codes 0, patched in the header's bytes)
    nib.save(nib.Nifti1Image(shape_volume("cube", rng, size=12), np.eye(4)), str(root / "flat.nii"))
    header = bytearray((root / "flat.nii").read_bytes())
    header[252:256] = struct.pack("<2h", 0, 0)  # qform_code, sform_code
    (root / "flat.nii").write_bytes(bytes(header))
    rows.append(("flat.nii", "cube", "P9"))
    # a 65-byte file whose header claims 2048 x 2048 x 512 int16 (4 GiB), and a real 4-D NIfTI (a time series)
    write_header_only_nifti(root / "claims.nii.gz", (2048, 2048, 512), (1.0, 1.0, 1.0))
    rows.append(("claims.nii.gz", "cube", "P13"))
    shutil.copy(nibabel_example_4d(), root / "example4d.nii.gz")
    rows.append(("example4d.nii.gz", "sphere", "P14"))
    # no label; a missing file
    write_nifti(root / "nolabel.nii.gz", shape_volume("cube", rng, size=12), SPACING)
    rows.append(("nolabel.nii.gz", "", "P10"))
    rows.append(("missing.nii.gz", "cube", "P11"))
    # the same voxels as good1
    shutil.copy(root / "good1.nii.gz", root / "copy.nii.gz")
    rows.append(("copy.nii.gz", "cube", "P12"))
    return rows


def test_every_cleaning_reason_is_counted_exactly_and_the_second_build_decodes_nothing(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    index = write_index(root, plant_defects(root, np.random.default_rng(2)))
    cfg = volumes_cfg(index, size=[12, 12, 12], window="soft_tissue", val_fraction=0.2, test_fraction=0.2)
    bundle = build_data(cfg, seed=0)
    report = bundle.report
    assert report["dropped"] == {"unreadable": 3, "bad_slices": 1, "no_geometry": 1, "not_3d": 1, "too_large": 1,
                                 "duplicate_series": 1, "duplicate": 1, "missing_label": 1}
    assert report["dropped_examples"]["too_large"] == ["claims.nii.gz"]
    assert report["dropped_examples"]["not_3d"] == ["example4d.nii.gz"]
    assert sorted(report["dropped_examples"]["unreadable"]) == ["cut.nii.gz", "missing.nii.gz", "photo.nii"]
    assert report["dropped_examples"]["bad_slices"] == ["series_gap"]
    assert report["dropped_examples"]["duplicate_series"] == ["series_again"]
    assert report["rows_kept"] == 5
    assert report["volume_cache"]["decoded"] == 13 and report["volume_cache"]["cached"] == 0  # all but 2 read
    from trainforge.data.summary import summarize  # the line the console shows

    assert ("dropped 10 (unreadable 3, bad_slices 1, no_geometry 1, not_3d 1, too_large 1, duplicate_series 1, "
            "duplicate 1, missing_label 1)" in summarize(report).line)
    again = build_data(cfg, seed=0).report
    assert again["volume_cache"]["decoded"] == 0 and again["volume_cache"]["cached"] == 13
    assert again["dropped"] == report["dropped"]


def test_a_tiny_volume_of_huge_spacing_is_dropped_before_resampling_allocates(tmp_path):
    """Issue 50, Medium 5: an 8-voxel-wide NIfTI and a DICOM series, both at 100 mm a voxel, would become 800^3
    voxels resampled to 1 mm (2 GiB as float32): each is dropped as too_large from its header, before MONAI
    allocates anything. The bound is data.args.max_volume_voxels: raised, the same files are read."""
    import resource

    rng = np.random.default_rng(4)
    root = tmp_path / "data"
    rows = []
    for k in range(6):
        write_nifti(root / f"good{k}.nii.gz", shape_volume(("sphere", "cube")[k % 2], rng, size=8), (2.0, 2.0, 2.0))
        rows.append((f"good{k}.nii.gz", ("sphere", "cube")[k % 2], f"P{k}"))
    write_nifti(root / "coarse.nii.gz", shape_volume("cube", rng, size=8), (100.0, 100.0, 100.0))
    rows.append(("coarse.nii.gz", "cube", "P6"))
    write_dicom_series(root / "coarse_series", shape_volume("cube", rng, size=8), (100.0, 100.0, 100.0),
                       patient_id="P7")
    rows.append(("coarse_series", "cube", "P7"))
    index = write_index(root, rows)
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = build_data(volumes_cfg(index, size=[8, 8, 8], spacing=[1.0, 1.0, 1.0]), seed=0).report
    assert report["dropped"]["too_large"] == 2
    assert sorted(report["dropped_examples"]["too_large"]) == ["coarse.nii.gz", "coarse_series"]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib < 512 * 1024  # not the 2 GiB of a resample
    coarse = build_data(volumes_cfg(index, size=[8, 8, 8], spacing=[50.0, 50.0, 50.0]), seed=0).report
    assert coarse["dropped"].get("too_large", 0) == 0 and coarse["rows_kept"] == 8  # 16^3 voxels: within the bound
    with pytest.raises(UserError, match="max_volume_voxels"):
        build_data(volumes_cfg(index, size=[8, 8, 8], max_volume_voxels=0), seed=0)


def test_a_patient_split_of_volumes_keeps_each_patient_in_one_split(tmp_path):
    rng = np.random.default_rng(3)
    root = tmp_path / "data"
    rows = []
    for p in range(12):
        for k in range(int(rng.integers(3, 6))):
            kind = ("sphere", "cube")[p % 2]
            write_nifti(root / f"p{p}" / f"s{k}.nii.gz", shape_volume(kind, rng, size=8), SPACING)
            rows.append((f"p{p}/s{k}.nii.gz", kind, f"patient-{p}"))
    index = write_index(root, rows)
    bundle = build_data(volumes_cfg(index, size=[8, 8, 8], group_by="patient_id", val_fraction=0.2,
                                    test_fraction=0.25), seed=0)
    where = {}
    for name in ("train", "val", "test"):
        ds = getattr(bundle, name)
        for i in ds.indices:
            patient = ds.samples.ids[int(i)].split("/")[0]
            assert where.setdefault(patient, name) == name, f"{patient} in {where[patient]} and {name}"
    assert len(where) == 12
    assert bundle.report["groups_per_split"] == {"train": 7, "val": 2, "test": 3}


@pytest.mark.parametrize("setting, message", [
    ({"window": {"center": 40, "width": 0}}, r"data.args.window: the width must be above 0 HU"),
    ({"window": "liver"}, r"data.args.window: choose a preset \(lung, soft_tissue, bone, brain\)"),
    ({"size": [64, 64]}, r"data.args.size: "),
])
def test_bad_volume_settings_are_one_line(tmp_path, setting, message):
    root = tmp_path / "data"
    write_nifti(root / "a" / "x.nii.gz", np.zeros((4, 4, 4), np.int16), SPACING)
    with pytest.raises(UserError, match=message) as e:
        build_data(volumes_cfg(root, **setting), seed=0)
    assert "\n" not in str(e.value)


def test_a_png_as_data_path_and_a_missing_group_column_are_one_line(tmp_path):
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "scan.png")
    with pytest.raises(UserError, match=r"data.path: scan.png is neither a folder nor an index"):
        build_data(volumes_cfg(tmp_path / "scan.png"), seed=0)
    root = tmp_path / "data"
    write_nifti(root / "x.nii.gz", np.zeros((4, 4, 4), np.int16), SPACING)
    index = write_index(root, [("x.nii.gz", "a", "P1")])
    with pytest.raises(UserError, match=r"data.group_by: index.csv has no column 'subject'"):
        build_data(volumes_cfg(index, group_by="subject"), seed=0)
    escape = write_index(root, [("../elsewhere.nii.gz", "a", "P1")], name="escape.csv")
    with pytest.raises(UserError, match=r"escape.csv line 2: '../elsewhere.nii.gz' is outside the index's folder"):
        build_data(volumes_cfg(escape), seed=0)


def test_gzip_is_what_a_cut_file_breaks():  # the planted defect above is what it claims to be
    assert gzip.compress(b"x" * 100)[:2] == b"\x1f\x8b"


def run_cli(*argv: str) -> "subprocess.CompletedProcess[str]":
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "trainforge", *argv], capture_output=True, text=True, timeout=300)


def test_bad_medical_and_multimodal_input_is_one_line_exit_2_through_the_cli(tmp_path):
    """Issue 29's bad inputs, as a user meets them: a NIfTI path that is a PNG, a window of width 0, group_by naming
    a column that is not there, a multimodal column of the wrong type. Nothing is written."""
    from PIL import Image

    from multimodal_data import write_drives

    root = tmp_path / "data"
    write_nifti(root / "x.nii.gz", np.zeros((4, 4, 4), np.int16), SPACING)
    index = write_index(root, [("x.nii.gz", "a", "P1")])
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "scan.png")
    drives = write_drives(tmp_path / "drives", 6, seed=0, side=8)
    lines = drives.read_text().splitlines()
    lines[3] = lines[3].replace(lines[3].split(",")[1], "fast", 1)
    drives.write_text("\n".join(lines) + "\n")
    cases = [
        (["ct_classification", f"data.path={tmp_path / 'scan.png'}"], "data.path: scan.png is neither a folder"),
        (["ct_classification", f"data.path={index}", "data.args.window={center: 40, width: 0}"],
         "data.args.window: the width must be above 0 HU"),
        (["ct_classification", f"data.path={index}", "data.group_by=subject"],
         "data.group_by: index.csv has no column 'subject'"),
        (["fusion_classifier", f"data.path={drives}"], "data.args.features: column 'speed' of index.csv holds 'fast'"),
    ]
    for args, message in cases:
        run = tmp_path / "run"
        out = run_cli("train", *args, "--run-dir", str(run))
        err = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(err) == 1 and message in err[0], (args, out.stderr[-2000:])
        assert not run.exists()


def test_3d_segmentation_reads_label_volumes_and_trains_on_foreground_biased_patches(tmp_path):
    from volume_data import write_lesions

    index = write_lesions(tmp_path / "data", patients=4, size=24, seed=5)
    rows = index.read_text().splitlines()
    rows.append("p0/ct0.nii.gz,,P0")  # no mask
    write_nifti(tmp_path / "data" / "small_mask.nii.gz", np.zeros((8, 8, 8), np.int16), (1.0, 1.0, 1.0))
    rows.append("p1/ct0.nii.gz,small_mask.nii.gz,P1")  # a mask of another grid
    index.write_text("\n".join(rows) + "\n")
    cfg = volumes_cfg(index, mask_column="mask", classes=["background", "lesion"], size=[24, 24, 24],
                      patch=[8, 8, 8], group_by="patient_id", val_fraction=0.25, test_fraction=0.25)
    cfg.augment.hflip = 0.5
    bundle = build_data(cfg, seed=0)
    assert bundle.info.task == "segmentation" and bundle.info.input_shape == (1, 8, 8, 8)  # the model sees a patch
    assert bundle.report["dropped"]["missing_mask"] == 1 and bundle.report["dropped"]["size_mismatch"] == 1
    assert bundle.report["voxels_per_class"]["lesion"] > 0
    x, y = bundle.val[0]
    assert x.shape == (1, 24, 24, 24) and y.shape == (24, 24, 24) and y.dtype == torch.int64  # whole volumes
    with_lesion = 0
    for epoch in range(10):
        for i in range(len(bundle.train)):
            px, py = bundle.train[(epoch, i)]
            assert px.shape == (1, 8, 8, 8) and py.shape == (8, 8, 8)
            with_lesion += int((py == 1).any())
    # a lesion fills about 3% of a volume: uniform 8^3 crops would hold some of it about a fifth of the time
    assert with_lesion > 0.45 * 10 * len(bundle.train)
    again = bundle.train[(3, 1)]
    assert torch.equal(again[0], bundle.train[(3, 1)][0])  # seeded by (epoch, index): a resume sees the same patch


def test_a_label_value_beyond_the_classes_is_one_line(tmp_path):
    from volume_data import write_lesions

    index = write_lesions(tmp_path / "data", patients=2, size=8, seed=6)
    mask = tmp_path / "data" / "p0" / "ct0_mask.nii.gz"
    write_nifti(mask, np.full((8, 8, 8), 3, np.int16), (1.0, 1.0, 1.0))
    with pytest.raises(UserError, match=r"ct0_mask.nii.gz: values 3 are no class of the 2 in data.args.classes"):
        build_data(volumes_cfg(index, mask_column="mask", classes=["background", "lesion"], size=[8, 8, 8]), seed=0)


def test_a_series_folder_with_a_link_out_of_it_is_not_read(tmp_path):
    """A slice that is a link to a file elsewhere (another user's, a secret) makes the series unreadable before any
    of it is opened."""
    root = tmp_path / "data"
    rng = np.random.default_rng(7)
    for k, kind in enumerate(("sphere", "cube")):
        write_nifti(root / f"v{k}.nii.gz", shape_volume(kind, rng, size=8), SPACING)
    series = write_dicom_series(root / "s", shape_volume("cube", rng, size=8), SPACING, patient_id="P9")
    secret = tmp_path / "secret.dcm"
    (series / "slice007.dcm").rename(secret)
    (series / "slice007.dcm").symlink_to(secret)
    index = write_index(root, [("v0.nii.gz", "sphere", "P1"), ("v1.nii.gz", "cube", "P2"), ("s", "cube", "P9")])
    report = build_data(volumes_cfg(index, size=[8, 8, 8], val_fraction=0.0, test_fraction=0.0), seed=0).report
    assert report["dropped"]["unreadable"] == 1 and report["dropped_examples"]["unreadable"] == ["s"]


def test_a_class_folder_never_follows_a_link_out_of_the_data_folder(tmp_path):
    """Issue 50, Medium 9: in a class-folder tree, a volume that is a link to a file outside data.path, and a class
    folder that is a link to a folder outside, are dropped as unreadable, never read; links inside are kept."""
    root, outside = tmp_path / "data", tmp_path / "elsewhere"
    rng = np.random.default_rng(8)
    for k in range(4):
        for kind in ("sphere", "cube"):
            write_nifti(root / kind / f"{kind}{k}.nii.gz", shape_volume(kind, rng, size=8), SPACING)
    write_nifti(outside / "secret.nii.gz", shape_volume("cube", rng, size=8), SPACING)
    (root / "cube" / "leak.nii.gz").symlink_to(outside / "secret.nii.gz")
    (root / "stolen").symlink_to(outside, target_is_directory=True)
    (root / "sphere" / "again.nii.gz").symlink_to(root / "sphere" / "sphere0.nii.gz")  # inside: fine
    report = build_data(volumes_cfg(root, size=[8, 8, 8], val_fraction=0.0, test_fraction=0.0), seed=0).report
    assert report["dropped"]["unreadable"] == 2
    assert sorted(report["dropped_examples"]["unreadable"]) == ["cube/leak.nii.gz", "stolen"]
    assert report["rows_kept"] + report["dropped"].get("duplicate", 0) == 9
