"""PyTorch -> ONNX: `torch.onnx.export(dynamo=True)` with a dynamic batch dimension, one self-contained file.

    path = export_onnx(model, example, out / "fp32.onnx", meta)    # meta: artifact.artifact_meta(...)

The exporter's per-node debugging metadata (source paths, stack traces) is dropped: it is most of the
graph's bytes for a small model and says nothing a deployed model needs. The weights are stored inside
the file (no .onnx.data side file), so the artifact's size is one number and it moves as one file.
"""
from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainforge.compression.artifact import INPUT_NAME, OUTPUT_NAME, embed_meta

MAX_BATCH = 65536


def export_onnx(model: nn.Module, example: torch.Tensor, path: Path, meta: dict[str, Any]) -> Path:
    """Export `model` (on the CPU, eval mode) taking `example`'s shape with any batch size; returns `path`."""
    import onnx  # heavy (onnx): loaded only when exporting

    model = model.to("cpu").eval()
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_name(path.stem + ".export.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # exporter chatter; failures still raise
        torch.onnx.export(
            model, (example[:2].contiguous(),), str(raw), dynamo=True, dynamic_shapes=({0: batch},),
            input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], external_data=False, optimize=True,
        )
    proto = onnx.load(str(raw))
    raw.unlink()
    slim(proto)
    embed_meta(proto, meta)
    onnx.save_model(proto, str(path), save_as_external_data=False)
    return path


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
