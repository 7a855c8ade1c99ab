"""User inputs -> the samples an ONNX artifact takes, preprocessed exactly as in training; numpy only.

    read = modality_reader(meta, artifact="model.onnx")   # the model's modality's reader; checks the metadata once
    for name, x in read(["a.png", "b.png"]):              # x: one sample, no batch dim
        ...

The reader of a model of one input is its modality's (`trainforge.data.modalities`: `Modality.reader`), chosen from
the artifact's metadata (`trainforge.compression.artifact`): image files for images (as the imagefolder source reads
them, or resized and cropped as a pretrained model's record says), NIfTI files and DICOM series for volumes, text
lines tokenized by the run's tokenizer, CSV rows by the run's feature columns; each normalized as in training.

Any model, of one input or several, also reads arrays as the graph takes them (`array_samples`): `.npz` files with
one array per input name, or `.npy` files for a model of one input; one sample each, or a batch along axis 0.

Nothing here imports torch: `trainforge predict` must run where only onnxruntime is installed.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Sequence

import numpy as np

from trainforge.data.modalities import MODALITIES, Reader
from trainforge.data.modalities.inputs import STDIN, require_files
from trainforge.errors import UserError

__all__ = ["STDIN", "ARRAY_SUFFIXES", "modality_reader", "own_suffixes", "serves_files", "reads_arrays",
           "array_samples"]

ARRAY_SUFFIXES = (".npz", ".npy")
MAX_ARRAY_BYTES = 4 << 30  # what one .npy/.npz INPUT may hold once read (a 1024^3 float32 volume)


def serves_files(modality: Optional[str]) -> bool:
    """Whether predict reads a model of this one input's modality from the user's own files (else arrays only)."""
    return modality in MODALITIES and bool(MODALITIES.get(modality).served)


def own_suffixes(modality: Optional[str]) -> tuple[str, ...]:
    """The array suffixes a modality's reader takes as its own files (a point cloud's .npy), else ()."""
    return MODALITIES.get(modality).own_suffixes if modality in MODALITIES else ()


def modality_reader(meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
    """The reader of the artifact's modality, the metadata checked once; UserError for a modality not registered."""
    name = meta.get("modality")
    if name not in MODALITIES:
        raise UserError(f"{artifact}: modality {name!r} in its metadata is not one this trainforge knows "
                        f"({', '.join(MODALITIES.names())}); pass --import with the module that registers it")
    return MODALITIES.get(name).reader(meta, artifact, stdin)


# ---- arrays (any model: .npz by input name, .npy for one input) ----------------------------------------


def reads_arrays(inputs: Sequence[str]) -> bool:
    return bool(inputs) and all(name.lower().endswith(ARRAY_SUFFIXES) for name in inputs)


def array_samples(inputs: Sequence[str], specs: Sequence[dict[str, Any]]) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
    """(name, {input name: one sample}) for each sample of each file: an array with the input's number of
    dimensions is one sample, one with a dimension more a batch of them (named file[i]). `specs`: the artifact's
    inputs ({name, shape, dtype}). Arrays are read without pickles, at most MAX_ARRAY_BYTES a file, and must be
    finite numbers of the input's kind (integers for integer inputs)."""
    require_files(inputs, ".npz files (an array per input name) or .npy files", allow_stdin=False)
    names = [str(s["name"]) for s in specs]
    for name in inputs:
        arrays = read_arrays(name, names)
        counts = set()
        for spec in specs:
            a = arrays[str(spec["name"])]
            ndim = len(spec["shape"])
            if a.ndim not in (ndim, ndim + 1):
                raise UserError(f"INPUT: {name}: {spec['name']!r} has shape {list(a.shape)}; the model takes "
                                f"{ndim}-dimensional samples like {spec['shape']} (or a batch of them along axis 0)")
            arrays[str(spec["name"])] = checked_array(a if a.ndim > ndim else a[None], spec, name)
            counts.add(len(arrays[str(spec["name"])]))
        if len(counts) != 1:
            raise UserError(f"INPUT: {name}: its arrays hold different numbers of samples ({sorted(counts)}); give "
                            "each input the same batch")
        (count,) = counts
        for i in range(count):
            yield (name if count == 1 else f"{name}[{i}]"), {k: arrays[k][i] for k in names}


def read_arrays(name: str, names: Sequence[str]) -> dict[str, np.ndarray]:
    """{input name: array} from one .npy (a model of one input) or .npz file."""
    import zipfile

    path = Path(name)
    try:
        if name.lower().endswith(".npy"):
            if len(names) != 1:
                raise UserError(f"INPUT: {name}: the model takes {len(names)} inputs ({', '.join(names)}); pass .npz "
                                "files with an array of each name")
            if path.stat().st_size > MAX_ARRAY_BYTES:
                raise UserError(f"INPUT: {name} is over {MAX_ARRAY_BYTES >> 30} GiB; split it into several files")
            with path.open("rb") as f:
                check_declared_size(f, path.stat().st_size, name)
            return {names[0]: np.load(path, allow_pickle=False)}
        with zipfile.ZipFile(path) as archive:
            members = {m.filename.removesuffix(".npy"): m for m in archive.infolist()}
            if sum(m.file_size for m in members.values()) > MAX_ARRAY_BYTES:  # the sizes once inflated
                raise UserError(f"INPUT: {name} holds over {MAX_ARRAY_BYTES >> 30} GiB once decompressed; split it")
            for key, member in members.items():
                with archive.open(member) as f:
                    check_declared_size(f, member.file_size, f"{name}: {key!r}")
        keys = list(names) if len(names) > 1 or names[0] in members else list(members)[:1]
        missing = [k for k in keys if k not in members]
        if missing or (len(names) == 1 and len(members) != 1 and names[0] not in members):
            raise UserError(f"INPUT: {name} holds {', '.join(sorted(members)) or 'no arrays'}; the model takes "
                            f"{', '.join(names)}: save one array of each name (numpy.savez)")
        with np.load(path, allow_pickle=False) as npz:
            return {want: np.asarray(npz[have]) for want, have in zip(names, keys)}
    except UserError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"INPUT: {name} is not a readable numpy file ({reason}); save it with numpy.save or "
                        "numpy.savez") from None


def check_declared_size(f: BinaryIO, stored_bytes: int, label: str) -> None:
    """An .npy header's shape and dtype claim no more bytes than are stored: numpy allocates what the header claims
    before it reads, so a 100-byte file claiming 4 TiB would otherwise be a MemoryError (or that much memory)."""
    from numpy.lib import format as npy

    version = npy.read_magic(f)
    read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, _, dtype = read_header(f)
    if math.prod(shape) * dtype.itemsize > stored_bytes:
        raise UserError(f"INPUT: {label} claims a {list(shape)} {dtype} array, more than the {stored_bytes} bytes it "
                        "holds; save it again with numpy.save or numpy.savez")


def checked_array(a: np.ndarray, spec: dict[str, Any], name: str) -> np.ndarray:
    """`a` as the input's dtype: integers for an integer input, finite numbers for a float one."""
    label = f"INPUT: {name}: {spec['name']!r}"
    if spec["dtype"] == "int64":
        if not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
            raise UserError(f"{label} holds {a.dtype} values; the model takes integers (token ids)")
        return a.astype(np.int64, copy=False)
    if not (np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_) or np.iscomplexobj(a):
        raise UserError(f"{label} holds {a.dtype} values; the model takes real numbers")
    a = a.astype(np.float32, copy=False)
    if not np.isfinite(a).all():
        raise UserError(f"{label} holds NaN or infinite values; pass finite numbers")
    return a
