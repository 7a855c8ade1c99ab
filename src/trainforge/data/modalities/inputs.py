"""Reading a user's files for `trainforge predict`: what every modality's reader shares (numpy only, no torch).

    shift_scale = normalization(meta["preprocess"]["normalize"], width=3, view=(-1, 1, 1), artifact="model.onnx")
    x = normalize(x, shift_scale)                      # the numpy twin of data/stages/normalize.Normalizer
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, BinaryIO, Optional, Sequence

import numpy as np

from trainforge.errors import UserError

STDIN = "-"
STD_FLOOR = 1e-6  # trainforge.data.stages.normalize.STD_FLOOR: the same floor on std and on max - min


# ---- normalization: the numpy twin of trainforge.data.stages.normalize.Normalizer --------------------------


def normalization(stats: Optional[dict[str, Any]], width: int, view: Sequence[int], artifact: str) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(shift, scale) as float32 shaped `view` (the modality's channel_view: (C, 1, 1) for images, (F,) for tabular
    data); None for no normalization.

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
