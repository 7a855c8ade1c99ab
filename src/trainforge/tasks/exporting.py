"""Torch modules a task's `export_module` wraps a model in, so the exported graph takes plain positional tensors."""
from __future__ import annotations

from typing import Any, Sequence

from torch import nn


class PositionalInputs(nn.Module):
    """Calls a model of named inputs (`model({"image": ..., "features": ...})`) with positional tensors, in `names`
    order: the ONNX graph's inputs are then the names themselves."""

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.names = model, tuple(names)

    def forward(self, *inputs: Any) -> Any:
        return self.model(dict(zip(self.names, inputs)))
