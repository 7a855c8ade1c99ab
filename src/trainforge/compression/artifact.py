"""The deployable artifact's contract: an ONNX file that carries its own serving facts.

Every ONNX file trainforge writes has the inputs and outputs its task's `ExportSignature` names (by default one
input named ``input`` and one output named ``logits``, the batch dimension dynamic), and a metadata entry
``trainforge`` holding JSON:

    {"format": "trainforge-onnx/1", "variant": "int8", "task": "classification", "modality": "image",
     "input_shape": [1, 8, 8], "input_dtype": "float32", "class_names": [...], "preprocess": {...},
     "inputs": [{"name": "input", "shape": [1, 8, 8], "dtype": "float32", "modality": "image"}],
     "graph_inputs": ["input"], "outputs": ["logits"], "task_module": "trainforge.tasks.classification"}

`inputs` are what predict feeds the task's `serve` (the graph's own inputs, except where the task prepares them:
3D detection serves a frame's points, shape [-1, 4], and cuts them into the graph's pillars), `graph_inputs` and
`outputs` the graph's, in order (an artifact written before they were recorded has the default pair); `task_module` is where the task is defined, so predict can say which module to `--import` for a task
that is not shipped (it never imports a module on an artifact's word).

`preprocess` is the run's preprocessing record (model.json's): normalization statistics, value range,
image size and channels, tokenizer and sequence length, or tabular feature names. Reading it needs only
onnxruntime, so a server that runs `trainforge predict` never imports torch. Its types are checked once,
when an artifact is loaded (`META_TYPES`), so a damaged or hand-edited entry is one error naming the field.
"""
from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any, Callable

from trainforge.errors import UserError
from trainforge.tasks import TASKS
from trainforge.tasks.base import INPUT_NAME, OUTPUT_NAME  # noqa: F401  (the default signature's names)

FORMAT = "trainforge-onnx/1"
# The variants `trainforge compress` writes, by name (compress --json "variants"[].name), and their files.
FILE_NAMES = {"fp32": "fp32.onnx", "pruned": "pruned.onnx", "int8": "int8.onnx", "pruned+int8": "pruned-int8.onnx"}
META_KEY = "trainforge"
MAX_INPUTS = 16


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # JSON true is not a size


def _is_number(v: Any) -> bool:
    return _is_int(v) or isinstance(v, float)


def _list_of(item: Callable[[Any], bool], length: int | None = None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and (length is None or len(v) == length) and all(item(x) for x in v)


def _or_none(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


_NUMBERS = (_list_of(_is_number), "a list of numbers")
# Every metadata field predict reads (dotted: nested in preprocess), with the type it must have. A field that
# is absent is left to the code that needs it; one of the wrong type would otherwise surface as a traceback.
META_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "variant": (_is_str, "a string"),
    "task": (_is_str, "a string"),
    "modality": (_is_str, "a string"),
    "input_dtype": (_is_str, "a string"),
    "input_shape": (_list_of(lambda d: _is_int(d) and d >= 1), "a list of positive integers"),
    "class_names": (_list_of(_is_str), "a list of strings"),
    "preprocess": (_is_dict, "an object"),
    "preprocess.value_range": (_list_of(_is_number, 2), "two numbers [low, high]"),
    "preprocess.normalize": (_or_none(_is_dict), "an object or null"),
    "preprocess.normalize.kind": (_is_str, "a string"),
    "preprocess.normalize.mean": _NUMBERS,
    "preprocess.normalize.std": _NUMBERS,
    "preprocess.normalize.min": _NUMBERS,
    "preprocess.normalize.max": _NUMBERS,
    "preprocess.tokenizer": (_or_none(_is_str), "a string or null"),
    "preprocess.vocab_size": (_or_none(_is_int), "an integer or null"),
    "preprocess.feature_names": (_or_none(_list_of(_is_str)), "a list of strings or null"),
    "inputs": (lambda v: _list_of(_is_input)(v) and 1 <= len(v) <= MAX_INPUTS,
               f"a list of 1 to {MAX_INPUTS} inputs, each {{name, shape: positive integers or -1, dtype, modality}}"),
    "graph_inputs": (lambda v: _list_of(_is_str)(v) and 1 <= len(v) <= MAX_INPUTS, "a list of input names"),
    "outputs": (lambda v: _list_of(_is_str)(v) and 1 <= len(v) <= MAX_INPUTS, "a list of output names"),
    "task_module": (_is_str, "a string"),
}


def _is_input(v: Any) -> bool:
    return (isinstance(v, dict) and _is_str(v.get("name")) and _is_str(v.get("dtype")) and _is_str(v.get("modality"))
            and _list_of(lambda d: _is_int(d) and (d >= 1 or d == -1))(v.get("shape")))  # -1: any length


def artifact_meta(variant: str, info: Any, preprocess: dict[str, Any]) -> dict[str, Any]:
    """The metadata of one variant, from the run's DataInfo and preprocessing record."""
    task = TASKS.get(info.task)
    return {
        "format": FORMAT,
        "variant": variant,
        "task": info.task,
        "modality": info.modality,
        "input_shape": list(info.input_shape),
        "input_dtype": info.input_dtype,
        "class_names": list(info.class_names),
        "preprocess": preprocess,
        "inputs": task.served_inputs(info),
        "graph_inputs": list(task.export_signature(info).inputs),
        "outputs": list(task.export_signature(info).outputs),
        "task_module": type(task).__module__,
    }


def input_specs(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The graph's inputs as the metadata records them (an artifact from before they were: its one input)."""
    if meta.get("inputs"):
        return list(meta["inputs"])
    return [{"name": INPUT_NAME, "shape": list(meta.get("input_shape") or []), "dtype": meta.get("input_dtype"),
             "modality": meta.get("modality")}]


def graph_input_names(meta: dict[str, Any]) -> list[str]:
    """The ONNX graph's own inputs: `graph_inputs` where the task serves other inputs than the graph takes (3D
    detection serves points and cuts them into the graph's pillars), else the served inputs' names."""
    return list(meta.get("graph_inputs") or [str(i["name"]) for i in input_specs(meta)])


def output_names(meta: dict[str, Any]) -> list[str]:
    return list(meta.get("outputs") or [OUTPUT_NAME])


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
    check_meta_types(meta, path)
    return meta


def check_meta_types(meta: dict[str, Any], path: Path) -> None:
    """UserError naming the first field of `META_TYPES` present in `meta` with the wrong type."""
    for field, (valid, expected) in META_TYPES.items():
        node: Any = meta
        for key in field.split("."):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            if not valid(node):
                raise UserError(f"{path}: trainforge metadata field {field} must be {expected}, got {reprlib.repr(node)}; "
                                "re-export it with `trainforge compress`")
