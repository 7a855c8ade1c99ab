"""The deployable artifact's contract: an ONNX file that carries its own serving facts.

Every ONNX file trainforge writes has one input named ``input`` (batch dimension dynamic), one output
named ``logits``, and a metadata entry ``trainforge`` holding JSON:

    {"format": "trainforge-onnx/1", "variant": "int8", "task": "classification", "modality": "image",
     "input_shape": [1, 8, 8], "input_dtype": "float32", "class_names": [...], "preprocess": {...}}

`preprocess` is the run's preprocessing record (model.json's): normalization statistics, value range,
image size and channels, tokenizer and sequence length, or tabular feature names. Reading it needs only
onnxruntime, so a server that runs `trainforge predict` never imports torch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainforge.errors import UserError

FORMAT = "trainforge-onnx/1"
META_KEY = "trainforge"
INPUT_NAME = "input"
OUTPUT_NAME = "logits"


def artifact_meta(variant: str, info: Any, preprocess: dict[str, Any]) -> dict[str, Any]:
    """The metadata of one variant, from the run's DataInfo and preprocessing record."""
    return {
        "format": FORMAT,
        "variant": variant,
        "task": info.task,
        "modality": info.modality,
        "input_shape": list(info.input_shape),
        "input_dtype": info.input_dtype,
        "class_names": list(info.class_names),
        "preprocess": preprocess,
    }


def embed_meta(model_proto: Any, meta: dict[str, Any]) -> None:
    """Store `meta` in an onnx.ModelProto's metadata_props (replacing an earlier entry)."""
    for i, prop in enumerate(model_proto.metadata_props):
        if prop.key == META_KEY:
            del model_proto.metadata_props[i]
            break
    entry = model_proto.metadata_props.add()
    entry.key, entry.value = META_KEY, json.dumps(meta)


def meta_from_session(session: Any, path: Path) -> dict[str, Any]:
    """The metadata of an onnxruntime.InferenceSession; a file without it is a user error."""
    raw = session.get_modelmeta().custom_metadata_map.get(META_KEY)
    if raw is None:
        raise UserError(f"{path}: an ONNX file without trainforge metadata; export it with `trainforge compress`")
    try:
        meta = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: damaged trainforge metadata ({exc.msg}); re-export it with `trainforge compress`") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise UserError(f"{path}: unsupported artifact format {found!r}; re-export it with this version")
    return meta
