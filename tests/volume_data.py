"""Generated CT volumes with known answers, written as the scanners' formats are: NIfTI with nibabel, DICOM series
(one file per slice, CT Image Storage, Hounsfield units through RescaleSlope/Intercept) with pydicom.

A volume is int16 HU in (x, y, z) voxel order: x along the DICOM columns (patient left), y along the rows
(posterior), z the slices (superior). Both writers place voxel (i, j, k) at the same physical point, so a reader
that honours the geometry gives the same voxels from both files."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

AIR_HU, TISSUE_HU = -1000, 40


def shape_volume(kind: str, rng: np.random.Generator, size: int = 24, hu: int = 300, noise_hu: float = 30.0) -> np.ndarray:
    """A sphere or a cube of `hu` in soft tissue with Gaussian noise, at a random centre; int16 (size, size, size)."""
    grid = np.indices((size, size, size)).astype(np.float64)
    radius = rng.uniform(size * 0.18, size * 0.26)
    centre = rng.uniform(size * 0.35, size * 0.65, 3)
    d = grid - centre[:, None, None, None]
    if kind == "sphere":
        inside = np.sqrt((d ** 2).sum(0)) <= radius
    else:  # a cube of the sphere's volume
        half = radius * (4 * np.pi / 3) ** (1 / 3) / 2
        inside = np.abs(d).max(0) <= half
    vol = np.full((size, size, size), TISSUE_HU, dtype=np.float64)
    vol[inside] = hu
    vol += rng.normal(0, noise_hu, vol.shape)
    return np.clip(np.round(vol), -1024, 3071).astype(np.int16)


def ras_affine(spacing: tuple[float, float, float]) -> np.ndarray:
    """The NIfTI affine of a volume whose x runs to patient left and y to posterior (DICOM's LPS axes), in RAS."""
    return np.diag([-spacing[0], -spacing[1], spacing[2], 1.0])


def write_nifti(path: Path, hu: np.ndarray, spacing: tuple[float, float, float]) -> Path:
    import nibabel as nib

    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(hu, ras_affine(spacing)), str(path))
    return path


def write_dicom_series(folder: Path, hu: np.ndarray, spacing: tuple[float, float, float], *, patient_id: str,
                       series_uid: Optional[str] = None, skip_slices: tuple[int, ...] = ()) -> Path:
    """One file per z slice; stored values are HU + 1024 (RescaleIntercept -1024). `skip_slices`: left out (a
    series with slices missing)."""
    import pydicom
    from pydicom.dataset import FileMetaDataset
    from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, generate_uid

    folder.mkdir(parents=True, exist_ok=True)
    series_uid = series_uid or generate_uid()
    study_uid = generate_uid()
    for k in range(hu.shape[2]):
        if k in skip_slices:
            continue
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = CTImageStorage
        meta.MediaStorageSOPInstanceUID = generate_uid()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = pydicom.Dataset()
        ds.file_meta = meta
        ds.SOPClassUID, ds.SOPInstanceUID = CTImageStorage, meta.MediaStorageSOPInstanceUID
        ds.PatientID, ds.StudyInstanceUID, ds.SeriesInstanceUID = patient_id, study_uid, series_uid
        ds.Modality = "CT"
        ds.InstanceNumber = k + 1
        ds.ImagePositionPatient = [0.0, 0.0, float(k * spacing[2])]
        ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        ds.PixelSpacing = [float(spacing[1]), float(spacing[0])]  # row spacing (y), column spacing (x)
        ds.SliceThickness = float(spacing[2])
        ds.Rows, ds.Columns = hu.shape[1], hu.shape[0]
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.RescaleIntercept, ds.RescaleSlope = -1024, 1
        ds.PixelData = (hu[:, :, k].T.astype(np.int32) + 1024).astype(np.uint16).tobytes()  # rows are y
        ds.save_as(folder / f"slice{k:03d}.dcm", enforce_file_format=True)
    return folder


def write_patients(root: Path, patients: int, size: int, seed: int) -> Path:
    """3-5 volumes per patient, each a sphere or a cube (drawn), every fourth a DICOM series; an index CSV."""
    rng = np.random.default_rng(seed)
    rows = ["path,label,patient_id"]
    for p in range(patients):
        for k in range(int(rng.integers(3, 6))):
            kind = ("sphere", "cube")[int(rng.integers(0, 2))]
            hu = shape_volume(kind, rng, size=size)
            if (p + k) % 4 == 0:
                write_dicom_series(root / f"p{p}" / f"s{k}", hu, (1.0, 1.0, 1.5), patient_id=f"P{p}")
                rows.append(f"p{p}/s{k},{kind},P{p}")
            else:
                write_nifti(root / f"p{p}" / f"v{k}.nii.gz", hu, (1.0, 1.0, 1.5))
                rows.append(f"p{p}/v{k}.nii.gz,{kind},P{p}")
    (root / "index.csv").write_text("\n".join(rows) + "\n")
    return root / "index.csv"


def write_lesions(root: Path, patients: int, size: int, seed: int) -> Path:
    """2-3 CT volumes per patient, each a bright sphere (the lesion, class 1) in noisy tissue, with its label volume
    (NIfTI, int16, the same grid); an index CSV of path,mask,patient_id."""
    rng = np.random.default_rng(seed)
    rows = ["path,mask,patient_id"]
    grid = np.indices((size, size, size)).astype(np.float64)
    for p in range(patients):
        for k in range(int(rng.integers(2, 4))):
            centre = rng.uniform(size * 0.3, size * 0.7, 3)
            inside = np.sqrt(((grid - centre[:, None, None, None]) ** 2).sum(0)) <= rng.uniform(size * 0.15, size * 0.25)
            hu = np.full((size,) * 3, TISSUE_HU, np.float64) + rng.normal(0, 30, (size,) * 3)
            hu[inside] += 200
            write_nifti(root / f"p{p}" / f"ct{k}.nii.gz", np.round(hu).astype(np.int16), (1.0, 1.0, 1.0))
            write_nifti(root / f"p{p}" / f"ct{k}_mask.nii.gz", inside.astype(np.int16), (1.0, 1.0, 1.0))
            rows.append(f"p{p}/ct{k}.nii.gz,p{p}/ct{k}_mask.nii.gz,P{p}")
    (root / "index.csv").write_text("\n".join(rows) + "\n")
    return root / "index.csv"


def write_header_only_nifti(path: Path, shape: tuple[int, ...], zooms: tuple[float, ...], dtype: str = "int16") -> Path:
    """A .nii.gz whose header claims `shape` voxels of `zooms` mm but that holds no voxel data (tens of bytes):
    a reader that trusts the header allocates (and zero-fills) the whole array."""
    import gzip

    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_dtype(np.dtype(dtype))
    header.set_data_shape(shape)
    header.set_zooms(zooms)
    header.set_qform(np.diag([*zooms[:3], 1.0]), code=1)
    header.set_sform(np.diag([*zooms[:3], 1.0]), code=1)
    header["vox_offset"] = 352
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(header.binaryblock + b"\0" * 4))
    return path


def nibabel_example_4d() -> Path:
    """nibabel's shipped 128 x 96 x 24 x 2 time series (a real 4-D NIfTI, as a new user would try it)."""
    import nibabel

    return Path(nibabel.__file__).parent / "tests" / "data" / "example4d.nii.gz"
