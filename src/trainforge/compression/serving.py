"""User inputs -> the samples an ONNX artifact takes, preprocessed exactly as in training; numpy only.

    read = READERS.get(meta["modality"])(meta, artifact="model.onnx")   # checks the metadata once
    for name, x in read(["a.png", "b.png"]):                            # x: one sample, no batch dim
        ...

One reader per modality, chosen from the artifact's metadata (`trainforge.compression.artifact`):
- image: image files, read in [0, 1] by `trainforge.data.image.read.read_image` (as the imagefolder
  source reads them), scaled to the training `value_range` (lo + x * (hi - lo): digits' 0..16 ink
  counts), then normalized per channel; a model trained with `data.normalize: model` reads them resized and
  cropped as its record says (`trainforge.data.image.preprocess`, as training read the files);
- text: text files (or `-`, standard input), each non-empty line one input, tokenized by the run's
  tokenizer (`bytes`: UTF-8 bytes + 1, padded; `none`: space-separated integer token ids);
- tabular: CSV files (or `-`) whose header names the run's feature columns, normalized per feature.

Any model, of one input or several, also reads arrays as the graph takes them (`array_samples`): `.npz` files with
one array per input name, or `.npy` files for a model of one input; one sample each, or a batch along axis 0.

Nothing here imports torch: `trainforge predict` must run where only onnxruntime is installed.
"""
from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Optional, Sequence

import numpy as np

from trainforge.errors import UserError
from trainforge.registry import Registry

STDIN = "-"
STD_FLOOR = 1e-6  # trainforge.data.stages.normalize.STD_FLOOR: the same floor on std and on max - min

Sample = tuple[str, np.ndarray]  # (the input as the user knows it, one sample without the batch dimension)
ARRAY_SUFFIXES = (".npz", ".npy")
MAX_ARRAY_BYTES = 4 << 30  # what one .npy/.npz INPUT may hold once read (a 1024^3 float32 volume)
Reader = Callable[[Sequence[str]], Iterator[Sample]]

READERS: Registry[Callable[..., Reader]] = Registry("modality", "modality")
# preprocess.tokenizer -> (the preprocessing record, seq_len) -> a line's token ids
TOKENIZERS: Registry[Callable[[dict[str, Any], int], Callable[[str], list[int]]]] = Registry(
    "tokenizer", "preprocess.tokenizer")


# ---- normalization: the numpy twin of trainforge.data.stages.normalize.Normalizer --------------------------


def normalization(stats: Optional[dict[str, Any]], width: int, modality: str, artifact: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(shift, scale) as float32 shaped (C, 1, 1) for images or (F,) for tabular data; None for no normalization.

    Like `Normalizer._make`, shift and scale are derived in float64 and then rounded to float32,
    so `(x - shift) / scale` in float32 gives the same bits as training.
    """
    if not stats or stats.get("kind", "none") == "none":
        return None
    kind = stats["kind"]
    keys = {"zscore": ("mean", "std"), "model": ("mean", "std"), "minmax": ("min", "max")}.get(kind)
    if keys is None:
        raise UserError(f"{artifact}: unknown normalization kind {kind!r} in its metadata; re-export it with this version")
    try:
        a, b = (np.asarray(stats[k], dtype=np.float64).reshape(-1) for k in keys)
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{artifact}: its {kind} normalization statistics are incomplete; re-export it") from None
    if len(a) != width or len(b) != width:
        raise UserError(f"{artifact}: {kind} statistics for {len(a)} channels/features, the model takes {width}; re-export it")
    scale = np.maximum(b - a if kind == "minmax" else b, STD_FLOOR)  # zscore, model: b is the std
    constant = stats.get("constant_features", [])  # constant in the train split: scale 1, only centred
    if not isinstance(constant, list) or not all(isinstance(i, int) and 0 <= i < width for i in constant):
        raise UserError(f"{artifact}: its normalization's constant_features must be channel/feature indices "
                        f"below {width}; re-export it")
    scale[constant] = 1.0
    view = {"image": (-1, 1, 1), "volume": (-1, 1, 1, 1)}.get(modality, (-1,))  # as data/stages/normalize.py
    return a.astype(np.float32).reshape(view), scale.astype(np.float32).reshape(view)


def normalize(x: np.ndarray, shift_scale: Optional[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    if shift_scale is None:
        return x
    shift, scale = shift_scale
    return (x - shift) / scale


def to_value_range(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Pixels in [0, 1] -> the training scale [lo, hi]; the default [0, 1] leaves every bit as it is."""
    if (lo, hi) == (0.0, 1.0):
        return x
    return np.float32(lo) + x * np.float32(hi - lo)


def input_shape(meta: dict[str, Any], ndim: int, artifact: str) -> list[int]:
    shape = meta.get("input_shape") or []
    if len(shape) != ndim:
        raise UserError(f"{artifact}: input_shape {shape} in its metadata; a {meta.get('modality')} model takes {ndim} dimension(s)")
    return [int(d) for d in shape]


# ---- reading the user's files -----------------------------------------------------------------------


def require_files(inputs: Sequence[str], what: str, allow_stdin: bool) -> None:
    """Every INPUT exists and is a file (checked before any inference, so a typo fails fast)."""
    for name in inputs:
        if name == STDIN:
            if not allow_stdin:
                raise UserError(f"INPUT: '-' (standard input) serves text and CSV models; pass {what}")
            continue
        path = Path(name)
        if not path.exists():
            raise UserError(f"INPUT: {name} does not exist; pass {what}")
        if not path.is_file():
            raise UserError(f"INPUT: {name} is a folder; pass {what}")
    if sum(name == STDIN for name in inputs) > 1:
        raise UserError("INPUT: '-' (standard input) given more than once; pass it once")


def read_bytes(name: str, stdin: Optional[BinaryIO]) -> bytes:
    if name != STDIN:
        try:
            return Path(name).read_bytes()
        except OSError as e:
            raise UserError(f"INPUT: cannot read {name} ({e.strerror}); check its permissions") from None
    if stdin is not None:
        return stdin.read()
    buffer = getattr(sys.stdin, "buffer", None)  # a replaced sys.stdin (tests, notebooks) may be text only
    return buffer.read() if buffer is not None else sys.stdin.read().encode("utf-8")


def display_name(name: str) -> str:
    return "stdin" if name == STDIN else name


def text_lines(data: bytes) -> list[tuple[int, str]]:
    """(line number, line) of each non-empty line, without its line break; bad UTF-8 becomes U+FFFD
    (as the jsonl source decodes its texts)."""
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    return [(no, line) for no, line in enumerate(text.split("\n"), start=1) if line.strip()]


# ---- image --------------------------------------------------------------------------------------------


def image_file_reader(pre: dict[str, Any], shape: list[int], artifact: str) -> Callable[[str], np.ndarray]:
    """An image file -> float32 (C, H, W) in [0, 1], as training read it: resized and cropped as the pretrained model
    expects when the run recorded that (`image_preprocess`), else resized to the square input size."""
    from trainforge.data.image.preprocess import ImagePreprocess  # Pillow + numpy; the code training used
    from trainforge.data.image.read import read_image, read_model_image

    channels, height, width = shape
    if pre.get("image_preprocess") is not None:
        try:
            spec = ImagePreprocess.from_json(pre["image_preprocess"])
        except ValueError as e:
            raise UserError(f"{artifact}: its image_preprocess metadata is damaged ({e}); re-export it") from None
        if list(spec.output_shape) != shape:
            raise UserError(f"{artifact}: its image_preprocess gives {list(spec.output_shape)} inputs, the model takes "
                            f"{shape}; re-export it")
        grayscale = bool(pre.get("grayscale", False))
        return lambda name: read_model_image(name, spec, grayscale)
    if height != width or channels not in (1, 3):
        raise UserError(
            f"{artifact}: the model takes {channels}x{height}x{width} inputs; predict reads images into square "
            "grayscale (1 channel) or RGB (3 channel) arrays only"
        )
    return lambda name: read_image(name, height, grayscale=channels == 1)


@READERS.register("image")
def image_reader(meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
    """Image files -> float32 (C, H, W), as the imagefolder source reads them, then value range and normalization."""
    shape = input_shape(meta, 3, artifact)
    pre = meta.get("preprocess", {})
    lo, hi = (float(v) for v in pre.get("value_range", (0.0, 1.0)))
    shift_scale = normalization(pre.get("normalize"), shape[0], "image", artifact)
    read_file = image_file_reader(pre, shape, artifact)

    def read(inputs: Sequence[str]) -> Iterator[Sample]:
        require_files(inputs, "image files (PNG, JPEG, ...)", allow_stdin=False)
        for name in inputs:
            try:
                x = read_file(name)
            except Exception as e:  # Pillow raises many types (OSError, SyntaxError, ValueError ...) for bad files
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise UserError(f"INPUT: {name} is not a readable image ({reason}); pass PNG, JPEG, ... files") from None
            yield name, normalize(to_value_range(x, lo, hi), shift_scale)

    return read


@READERS.register("volume")
def volume_reader(meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
    """NIfTI files and DICOM series folders -> float32 (C, D, H, W), prepared as the volumes source prepared the
    training data (the stored orientation, spacing, window, size; MONAI), then normalization."""
    shape = input_shape(meta, 4, artifact)
    pre = meta.get("preprocess", {})
    settings = pre.get("volume")
    if not isinstance(settings, dict) or list(pre.get("patch") or settings.get("size") or []) != shape[1:]:
        raise UserError(f"{artifact}: its metadata lacks the volume preprocessing of its {shape[1:]} input; re-export it")
    shift_scale = normalization(pre.get("normalize"), shape[0], "volume", artifact)
    what = "NIfTI files (.nii, .nii.gz) or DICOM series folders"

    def read(inputs: Sequence[str]) -> Iterator[Sample]:
        from trainforge.data.sources.volumes import NIFTI_SUFFIXES, prepare_volume  # MONAI: only volumes need it

        for name in inputs:
            path = Path(name)
            if name == STDIN or not path.exists():
                raise UserError(f"INPUT: {name} does not exist; pass {what}")
            if path.is_file() and not path.name.lower().endswith(NIFTI_SUFFIXES):
                raise UserError(f"INPUT: {name} is not a NIfTI file (.nii, .nii.gz); pass {what}")
        for name in inputs:
            try:
                x = prepare_volume(name, settings)
            except Exception as e:  # MONAI, nibabel and pydicom raise many types for a file they cannot read
                reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                raise UserError(f"INPUT: {name} is not a readable volume ({reason}); pass {what}") from None
            yield name, normalize(x, shift_scale)

    return read


# ---- text ---------------------------------------------------------------------------------------------


@TOKENIZERS.register("bytes")
def bytes_tokens(pre: dict[str, Any], seq_len: int) -> Callable[[str], list[int]]:
    from trainforge.data.text import encode  # torch-free; the jsonl source's tokenizer

    return lambda line: encode(line, seq_len)


@TOKENIZERS.register("none")
def integer_tokens(pre: dict[str, Any], seq_len: int) -> Callable[[str], list[int]]:
    """The line is the token ids themselves, space separated (synthetic_text); there is no padding id."""

    def tokenize(line: str) -> list[int]:
        try:
            ids = [int(tok) for tok in line.split()]
        except ValueError:
            raise ValueError("expected space-separated integer token ids") from None
        if len(ids) != seq_len:
            raise ValueError(f"{len(ids)} token ids; the model takes exactly {seq_len}")
        return ids

    return tokenize


@TOKENIZERS.register("model")
@TOKENIZERS.register("bpe")
def stored_tokens(pre: dict[str, Any], seq_len: int) -> Callable[[str], list[int]]:
    """The run's own subword tokenizer, from the files stored in its metadata (the `tokenizers` library only)."""
    from trainforge.data.text import TextTokenizer, is_stored  # tokenizers + numpy, no torch

    if not is_stored(pre):
        raise ValueError("its metadata lacks the tokenizer's files")
    tok = TextTokenizer.from_preprocess(pre)
    return lambda line: tok.encode_fixed([line], seq_len)[0].tolist()


@READERS.register("text")
def text_reader(meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
    """Text files or '-' -> int64 (T,) per non-empty line, tokenized as in training."""
    pre = meta.get("preprocess", {})
    (seq_len,) = input_shape(meta, 1, artifact)
    name = pre.get("tokenizer")
    if name not in TOKENIZERS:
        raise UserError(
            f"{artifact}: tokenizer {name!r} in its metadata cannot serve classification; "
            f"predict knows: {', '.join(TOKENIZERS.names())}"
        )
    try:
        tokenize = TOKENIZERS.get(name)(pre, seq_len)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{artifact}: its {name} tokenizer cannot be read ({e}); re-export it") from None
    vocab_size = int(pre.get("vocab_size") or 0)

    def read(inputs: Sequence[str]) -> Iterator[Sample]:
        require_files(inputs, "text files (one input per line) or - for standard input", allow_stdin=True)
        for source in inputs:
            for line_no, line in text_lines(read_bytes(source, stdin)):
                where = f"INPUT: {display_name(source)} line {line_no}"
                try:
                    ids = np.asarray(tokenize(line), dtype=np.int64)
                except ValueError as e:
                    raise UserError(f"{where}: {e}; fix or remove that line") from None
                if vocab_size and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                    raise UserError(f"{where}: token ids must be in 0..{vocab_size - 1} (the model's vocabulary); fix that line")
                yield line, ids

    return read


# ---- tabular ------------------------------------------------------------------------------------------


def feature_value(cell: str) -> Optional[float]:
    """A finite number, or None (empty, not a number, NaN or infinite: training dropped such rows)."""
    try:
        value = float(cell.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def csv_rows(source: str, data: bytes, feature_names: Optional[list[str]], num_features: int) -> Iterator[tuple[str, list[float]]]:
    """(source:line, the feature values in the model's order) of each data row of one CSV text."""
    shown = display_name(source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"INPUT: {shown} is not UTF-8 text; save the CSV as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader, [])]
        if not header:
            raise UserError(f"INPUT: {shown} is empty; it needs a header row naming the feature columns")
        if feature_names is None:  # a custom source without names: every column is a feature, in order
            if len(header) != num_features:
                raise UserError(f"INPUT: {shown} has {len(header)} columns; the model takes exactly {num_features} features")
            columns = list(range(num_features))
        else:
            missing = [f for f in feature_names if f not in header]
            if missing:
                raise UserError(
                    f"INPUT: {shown} lacks column(s) {', '.join(map(repr, missing))}; the model needs "
                    f"{', '.join(feature_names)} (extra columns are ignored)"
                )
            columns = [header.index(f) for f in feature_names]
        row_no = 0
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # a blank line is not a record (as in training)
            row_no += 1
            where = f"INPUT: {shown} row {row_no} (line {reader.line_num})"
            if len(row) != len(header):
                raise UserError(f"{where}: {len(row)} fields, the header has {len(header)}; fix that row")
            values = []
            for i in columns:
                value = feature_value(row[i])
                if value is None:
                    raise UserError(f"{where}, column {header[i]!r}: {row[i]!r} is not a finite number; write a number there")
                values.append(value)
            yield f"{shown}:{reader.line_num}", values
    except csv.Error as e:
        raise UserError(f"INPUT: {shown} line {reader.line_num} is not valid CSV ({e})") from None


@READERS.register("tabular")
def tabular_reader(meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
    """CSV files or '-' -> float32 (F,) per row: the stored feature columns by name, normalized per feature."""
    pre = meta.get("preprocess", {})
    (num_features,) = input_shape(meta, 1, artifact)
    names = pre.get("feature_names")
    if names is not None and len(names) != num_features:
        raise UserError(f"{artifact}: {len(names)} feature names for {num_features} features in its metadata; re-export it")
    shift_scale = normalization(pre.get("normalize"), num_features, "tabular", artifact)

    def read(inputs: Sequence[str]) -> Iterator[Sample]:
        require_files(inputs, "CSV files with a header row", allow_stdin=True)
        for source in inputs:
            for name, values in csv_rows(source, read_bytes(source, stdin), names, num_features):
                # float32 first, as torch.tensor(features, dtype=float32) stored the training rows
                yield name, normalize(np.asarray(values, dtype=np.float32), shift_scale)

    return read


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
