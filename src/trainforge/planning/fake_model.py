"""The recipe's model as fake tensors: built on the meta device, then given fake CPU storage.

    with FakeTensorMode():
        model, spec = build_fake_model(cfg.model, info)     # parameters are FakeTensors on the CPU

Why not build it under `FakeTensorMode` directly: some factories read tensor values while they build,
e.g. timm's ViTs take their drop-path rates from `torch.linspace(0, rate, depth, device="cpu").tolist()`,
a data-dependent call fake tensors refuse. On the meta device such an explicitly-placed tensor is a real
(tiny) CPU tensor and the call works; everything else is a meta tensor, which costs nothing. Every zoo
model builds on the meta device (tests/models/test_model_planning.py; the planner's `model_facts` already
relies on it), and `materializing()` is False there, so no weights are read.

The conversion then gives each parameter, buffer and tensor attribute an empty fake CPU tensor of the same
shape, strides, dtype and `requires_grad`, under the fake mode active at the call. A tensor shared by several
modules (tied embeddings) is converted once, so it stays shared. Values are never needed: fake tensors
have none.
"""
from __future__ import annotations

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.models import build_model
from trainforge.models.base import InputSpec

FAKE_DEVICE = torch.device("cpu")  # the device the simulation's fake tensors claim to be on


def build_fake_model(model_cfg: ModelConfig, info: DataInfo) -> tuple[nn.Module, InputSpec]:
    """`build_model` on the meta device, converted to fake CPU tensors; call under an active FakeTensorMode
    (the build itself runs outside it, so the tensors a factory places on the CPU itself are real)."""
    if not isinstance(torch.empty(0), FakeTensor):
        raise RuntimeError("build_fake_model needs an active FakeTensorMode")
    with unset_fake_temporarily(), torch.device("meta"):
        model, spec = build_model(model_cfg, info)
    fake_tensors(model)
    return model, spec


def fake_tensors(model: nn.Module) -> nn.Module:
    """Replace every parameter, buffer and tensor attribute of `model` (meta, or real ones a factory placed
    itself) by an empty tensor on FAKE_DEVICE (a FakeTensor under an active FakeTensorMode), each shared tensor
    once; in place, returns `model`."""
    converted: dict[int, torch.Tensor] = {}

    def convert(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in converted:
            empty = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=FAKE_DEVICE)
            if isinstance(t, nn.Parameter):
                empty = nn.Parameter(empty, requires_grad=t.requires_grad)
            converted[id(t)] = empty
        return converted[id(t)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None and not isinstance(t, FakeTensor):
                    table[name] = convert(t)
        for name, value in list(vars(module).items()):  # plain tensor attributes (e.g. a cached rotary table)
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                setattr(module, name, convert(value))
    return model
