"""Torch modules a task's `export_module` wraps a model in, so the exported graph takes plain positional tensors."""
from __future__ import annotations

from typing import Any, Sequence

from torch import nn


class PositionalInputs(nn.Module):
    """Calls a model of named inputs (`model({"image": ..., "features": ...})`) with positional tensors, in `names`
    order: the ONNX graph's inputs are then the names themselves. `outputs`: a model that returns a dict of named
    outputs gives them as a tuple in this order (the graph's outputs)."""

    def __init__(self, model: nn.Module, names: Sequence[str], outputs: Sequence[str] = ()) -> None:
        super().__init__()
        self.model, self.names, self.outputs = model, tuple(names), tuple(outputs)

    def forward(self, *inputs: Any) -> Any:
        out = self.model(dict(zip(self.names, inputs)))
        return tuple(out[name] for name in self.outputs) if self.outputs else out


class OneImageDetections(nn.Module):
    """A torchvision-convention detector as a graph of one image: (1, C, H, W) -> its (n, 4) boxes, (n,) scores and
    (n,) labels, n the detections it kept. torchvision's detectors take a list of images and trace to a graph of a
    fixed number of them; one image a call keeps each image's own number of detections (the task pads them)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    @property
    def onnx_exporters(self) -> Any:
        """The wrapped model's exporters (compression/export.py), if its family names them."""
        return getattr(self.model, "onnx_exporters", None)

    def forward(self, images: Any) -> Any:
        (found,) = self.model([images[0]])
        return found["boxes"], found["scores"], found["labels"]
