"""Optimizers from `optim` config, with weight decay only where it belongs.

No weight decay on biases, normalization weights, embeddings (token and position) or other
parameters with fewer than two dimensions: decaying them hurts and is standard practice to skip.
"""
from __future__ import annotations

import inspect
from typing import Callable

import torch
from torch import nn

from trainforge.config import OptimConfig
from trainforge.registry import Registry

OptimizerFactory = Callable[[list[dict], OptimConfig, bool], torch.optim.Optimizer]
OPTIMIZERS: Registry[OptimizerFactory] = Registry("optimizer", "optim.name")

_NO_DECAY_MODULES = (nn.Embedding, nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase, nn.RMSNorm)
_NO_DECAY_NAMES = ("pos_emb", "pos_embed", "position", "cls_token", "wpe")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay, seen = [], [], set()
    for mod_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            full = f"{mod_name}.{name}" if mod_name else name
            skip = (
                p.ndim < 2
                or isinstance(module, _NO_DECAY_MODULES)
                or any(key in full for key in _NO_DECAY_NAMES)
            )
            (no_decay if skip else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def _impl_kwargs(cls: type, on_accelerator: bool) -> dict:
    """Fused kernels on accelerators (fastest), foreach elsewhere (torch's default on CPU)."""
    params = inspect.signature(cls).parameters
    if on_accelerator and "fused" in params:
        return {"fused": True}
    return {}


@OPTIMIZERS.register("adamw")
def adamw(groups: list[dict], cfg: OptimConfig, on_accelerator: bool) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **_impl_kwargs(torch.optim.AdamW, on_accelerator)
    )


@OPTIMIZERS.register("sgd")
def sgd(groups: list[dict], cfg: OptimConfig, on_accelerator: bool) -> torch.optim.Optimizer:
    return torch.optim.SGD(
        groups,
        lr=cfg.lr,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov and cfg.momentum > 0,
        **_impl_kwargs(torch.optim.SGD, on_accelerator),
    )


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    factory = OPTIMIZERS.get(cfg.name)
    on_accelerator = any(p.device.type != "cpu" for p in model.parameters())
    return factory(param_groups(model, cfg.weight_decay), cfg, on_accelerator)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
