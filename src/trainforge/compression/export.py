"""PyTorch -> ONNX: `torch.onnx.export(dynamo=True)` with a dynamic batch dimension, one self-contained file.

    path = export_onnx(model, example, out / "fp32.onnx", meta)    # meta: artifact.artifact_meta(...)
    path = export_onnx(task.export_module(model, info), examples, path, meta, task.export_signature(info))

The graph's names and dynamic axes are the task's `ExportSignature` (default: one input `input`, one output
`logits`, each dynamic along the batch); `example` is one tensor or a tuple of them, one per signature input.

The same exporter serves the zoo, transformers (`model.name: hf`: HFModel's attention mask, computed from the
pad id inside forward, is part of the graph) and timm models. A model torch.export cannot take is exported by
the TorchScript tracer instead (`dynamo=False`, also with a dynamic batch); one neither can take is a one-line
UserError. A model family that knows torch.export cannot take it says so with an `onnx_exporters` attribute (the
exporters to try, in order): torchvision's detectors pick their boxes by value, which torch.export gives up on
only after minutes (155-175 s for a ResNet-18 Faster R-CNN or RetinaNet on 2 busy cores, the tracer then taking
4 s).

The exporter's per-node debugging metadata (source paths, stack traces) is dropped: it is most of the
graph's bytes for a small model and says nothing a deployed model needs. The weights are stored inside
the file (no .onnx.data side file), so the artifact's size is one number and it moves as one file.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainforge.compression.artifact import INPUT_NAME, OUTPUT_NAME, embed_meta
from trainforge.errors import UserError
from trainforge.tasks.base import ExportSignature

MAX_BATCH = 65536
EXPORTERS = ("dynamo", "torchscript")  # tried in this order unless the model names its own (`onnx_exporters`)
EXPORTER_NAMES = {"dynamo": "dynamo", "torchscript": "TorchScript"}
LEGACY_OPSET = 18  # the TorchScript fallback's opset (dynamo writes 20); onnxruntime runs both


def export_onnx(model: nn.Module, example: torch.Tensor | tuple[torch.Tensor, ...], path: Path, meta: dict[str, Any],
                signature: ExportSignature | None = None) -> Path:
    """Export `model` (on the CPU, eval mode) taking `example`'s shapes with the signature's dynamic axes (default:
    one input, one output, any batch size); returns `path`."""
    import onnx  # heavy (onnx): loaded only when exporting

    model = model.to("cpu").eval()
    signature = signature or ExportSignature.batched([INPUT_NAME], [OUTPUT_NAME])
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_name(path.stem + ".export.onnx")
    examples = tuple(x[:2].contiguous() for x in (example if isinstance(example, tuple) else (example,)))
    errors = []
    for exporter in exporters_of(model):
        try:
            _export(model, examples, raw, signature, dynamo=exporter == "dynamo")
            break
        except Exception as error:  # noqa: BLE001  torch.export and its ONNX translation raise many types
            errors.append(f"{EXPORTER_NAMES[exporter]}: {_first_line(error)}")
    else:
        raw.unlink(missing_ok=True)
        raise UserError(f"ONNX export of {type(model).__name__} failed with torch's exporters ({'; '.join(errors)}); "
                        "compress cannot write ONNX artifacts for this model; serve its final/ weights "
                        "from PyTorch")
    proto = onnx.load(str(raw))
    raw.unlink()
    slim(proto)
    embed_meta(proto, meta)
    onnx.save_model(proto, str(path), save_as_external_data=False)
    return path


def exporters_of(model: nn.Module) -> tuple[str, ...]:
    """The exporters to try on `model`, in order: its own `onnx_exporters` (a model family that knows one of them
    cannot take it), else dynamo, then the TorchScript tracer."""
    chosen = tuple(getattr(model, "onnx_exporters", None) or EXPORTERS)
    unknown = set(chosen) - set(EXPORTERS)
    if unknown:
        raise ValueError(f"onnx_exporters of {type(model).__name__}: {sorted(unknown)} are not among {EXPORTERS}")
    return chosen


def _export(model: nn.Module, examples: tuple[torch.Tensor, ...], raw: Path, signature: ExportSignature, *,
            dynamo: bool) -> None:
    """One exporter: dynamo (torch.export; the default), or the TorchScript tracer, the fallback for a model
    torch.export cannot decompose (e.g. timm's relative-position ViTs in torch 2.14). Both give the signature's
    dynamic axes (a label shared by several inputs, such as the batch, is one dimension)."""
    names = dict(input_names=list(signature.inputs), output_names=list(signature.outputs))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            _quiet_optimizer():
        warnings.simplefilter("ignore")  # exporter chatter (the tracer prints its graph on failure); failures still raise
        if dynamo:
            dims: dict[str, Any] = {}
            shapes = tuple({axis: dims.setdefault(label, torch.export.Dim(label, min=1, max=MAX_BATCH))
                            for axis, label in signature.dynamic_axes.get(name, {}).items()}
                           for name in signature.inputs)
            torch.onnx.export(model, examples, str(raw), dynamo=True, dynamic_shapes=shapes, external_data=False,
                              optimize=True, **names)
        else:
            with _stdout_fd_to_devnull():
                torch.onnx.export(model, examples, str(raw), dynamo=False, opset_version=LEGACY_OPSET,
                                  dynamic_axes={k: dict(v) for k, v in signature.dynamic_axes.items()}, **names)


def _first_line(error: BaseException) -> str:
    """The gist of an exporter error: its "Exception summary" line when it has one (dynamo's long reports)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip()  # dynamo colours its report
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    summary = next((lines[i + 1] for i, line in enumerate(lines[:-1]) if line.startswith("## Exception summary")), None)
    line = summary or (lines[0] if lines else type(error).__name__)
    return line[:200]


@contextlib.contextmanager
def _stdout_fd_to_devnull() -> Any:
    """The TorchScript exporter's C++ log writes to file descriptor 1 directly (torch 2.14 switches it on for every
    export, and dumps the whole graph when one fails); stdout must stay one JSON document (`compress --json`)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def _quiet_optimizer() -> Any:
    """onnxscript's constant folder logs each node it could not fold at WARNING ("Evaluation failed: cannot
    reshape ...", e.g. on a transformers model's attention-mask arithmetic); the node is kept as is and computed
    at run time, so the message says nothing a user can act on."""
    logger = logging.getLogger("onnxscript")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def slim(proto: Any) -> None:
    """Drop what serving never reads: per-node debug metadata, doc strings, intermediate shape records;
    then give nodes and internal tensors short names (the graph's input and output keep theirs)."""
    for node in proto.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    del proto.graph.value_info[:]
    short_names(proto.graph)


def short_names(graph: Any) -> None:
    """Rename nodes n0, n1, ... and every tensor but the graph's inputs and outputs t0, t1, ...

    Names only label the graph; a small model's exporter- and quantizer-made names ("blocks.0.attn.c_attn.
    weight_quantized_scale") can outweigh its int8 weights. Graphs with subgraphs (If, Loop) keep their names.
    """
    if any(attr.type in (attr.GRAPH, attr.GRAPHS) for node in graph.node for attr in node.attribute):
        return
    keep = {v.name for v in graph.input} | {v.name for v in graph.output} | {""}
    renamed: dict[str, str] = {}

    def short(name: str) -> str:
        if name in keep:
            return name
        if name not in renamed:
            renamed[name] = f"t{len(renamed)}"
        return renamed[name]

    for init in graph.initializer:
        init.name = short(init.name)
    for i, node in enumerate(graph.node):
        node.name = f"n{i}"
        node.input[:] = [short(n) for n in node.input]
        node.output[:] = [short(n) for n in node.output]
