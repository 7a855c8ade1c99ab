"""The one model contract of the zoo.

A factory is registered under a name and called as ``factory(info, **model.args)``; it returns
``(module, InputSpec)``. The module maps a batch of inputs to logits: (B, num_classes) for
classification, (B, T, vocab) for language models. It knows nothing of DDP, AMP or compile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]  # one sample, without the batch dimension
    dtype: torch.dtype
    high: Optional[int] = None  # exclusive upper bound of integer token ids

    def example(self, batch_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """An example batch of `batch_size` inputs (deterministic, for planning, export and tests)."""
        g = torch.Generator().manual_seed(0)
        if self.dtype.is_floating_point:
            x = torch.randn((batch_size, *self.shape), generator=g, dtype=self.dtype)
        else:
            x = torch.randint(0, self.high or 2, (batch_size, *self.shape), generator=g, dtype=self.dtype)
        return x.to(device)


@dataclass(frozen=True)
class NamedInputs:
    """A model that takes several named inputs (an image and a feature vector, fused): `example` is a dict of each
    input's example batch, as the task's collate makes them."""

    specs: tuple[tuple[str, InputSpec], ...]

    def example(self, batch_size: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return {name: spec.example(batch_size, device) for name, spec in self.specs}


def materializing() -> bool:
    """Are tensors made now real? False on the meta device or under fake tensors (the planner, the launcher's
    checks): a pretrained family then builds its architecture and reads no weights."""
    probe = torch.empty(0)
    return probe.device.type != "meta" and not isinstance(probe, FakeTensor)
