"""Optimizers from `optim` config, with weight decay only where it belongs; what is trained at all.

No weight decay on biases, normalization weights, embeddings (token and position) or other
parameters with fewer than two dimensions: decaying them hurts and is standard practice to skip.

Fine-tuning controls, by parameter name (a glob, or a regex after "re:"; `matching` is the one rule):
- `train.freeze`: matching parameters get no gradient and no optimizer state (`freeze`);
- `optim.param_groups`: the first group whose pattern matches sets the parameter's peak LR and weight decay;
- `optim.layer_decay` d: a parameter of layer i of L (numbered blocks: `layers.3.`, `h.3.`, `blocks.3.`) gets
  LR x d^(L - i); parameters before the first block (embeddings) count as layer 0 (d^(L+1)), after the last
  one (final norm, head) as layer L+1 (x 1).
Each torch param group carries `lr_scale`; `set_lr` applies the scheduled LR times it, so every group follows
the same warmup and decay.
"""
from __future__ import annotations

import fnmatch
import inspect
import re
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from trainforge.config import OptimConfig
from trainforge.errors import UserError, quote
from trainforge.registry import Registry

OptimizerFactory = Callable[[list[dict], OptimConfig, bool], torch.optim.Optimizer]
OPTIMIZERS: Registry[OptimizerFactory] = Registry("optimizer", "optim.name")

_NO_DECAY_MODULES = (nn.Embedding, nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase, nn.RMSNorm)
_NO_DECAY_NAMES = ("pos_emb", "pos_embed", "position", "cls_token", "wpe")


def matching(pattern: str, name: str) -> bool:
    """Does parameter `name` match `pattern`: a glob (`encoder.layer.*`), or a regex after "re:" (searched)."""
    if pattern.startswith("re:"):
        return re.search(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def _check_pattern(pattern: str, field: str) -> None:
    if pattern.startswith("re:"):
        try:
            re.compile(pattern[3:])
        except re.error as e:
            raise UserError(f"{field}: {quote(pattern)} is not a regular expression ({e})", public=True) from None


def _unmatched(field: str, pattern: str, names: Sequence[str]) -> UserError:
    """Public: it holds the submitter's own pattern and the parameter names of the model the recipe names."""
    sample = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return UserError(f"{field}: {quote(pattern)} matches no parameter of this model (names look like {sample}); "
                     "fix the pattern (a glob, or a regex after re:)", public=True)


EVERYTHING_FROZEN = "train.freeze: every parameter is frozen, so there is nothing to train; freeze fewer"


def freeze(model: nn.Module, patterns: Sequence[str]) -> tuple[int, int]:
    """Turn off the gradient of every parameter matching one of `patterns` (`train.freeze`); returns
    (parameters frozen, parameters in all). A pattern that matches nothing is a UserError (a typo)."""
    named = list(model.named_parameters())
    names = [n for n, _ in named]
    for i, pattern in enumerate(patterns):
        field = f"train.freeze[{i}]"
        _check_pattern(pattern, field)
        hits = [p for n, p in named if matching(pattern, n)]
        if not hits:
            raise _unmatched(field, pattern, names)
        for p in hits:
            p.requires_grad_(False)
    if named and not any(p.requires_grad for _, p in named):  # here, before the planner's backward pass fails on it
        raise UserError(EVERYTHING_FROZEN, public=True)
    total = sum(p.numel() for _, p in named)
    return sum(p.numel() for _, p in named if not p.requires_grad), total


_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def layer_ids(names: Sequence[str]) -> tuple[list[int], int]:
    """(layer id of each name, number of layers L): the first number in a dotted name is its block; names
    before the first block are layer 0, after the last one L + 1."""
    numbers = [_LAYER.search(n) for n in names]
    ids = [int(m.group(1)) + 1 if m else None for m in numbers]
    known = [i for i in ids if i is not None]
    if not known:
        return [0] * len(names), 0
    depth = max(known)
    first = next(k for k, i in enumerate(ids) if i is not None)
    out = [i if i is not None else (0 if k < first else depth + 1) for k, i in enumerate(ids)]
    return out, depth


def param_groups(model: nn.Module, cfg: OptimConfig) -> list[dict]:
    """Torch param groups: by (LR scale, weight decay), each with its `lr_scale`; frozen parameters left out."""
    entries = []  # (name, param, module is a no-decay kind)
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            entries.append((f"{mod_name}.{name}" if mod_name else name, p, isinstance(module, _NO_DECAY_MODULES)))
    names = [n for n, _, _ in entries]
    for i, group in enumerate(cfg.param_groups):
        _check_pattern(group.match, f"optim.param_groups[{i}].match")
        if not any(matching(group.match, n) for n, p, _ in entries if p.requires_grad):
            raise _unmatched(f"optim.param_groups[{i}].match", group.match, names)
    ids, depth = layer_ids(names) if cfg.layer_decay is not None else ([0] * len(names), 0)
    buckets: dict[tuple[float, float], list[nn.Parameter]] = {}
    for (full, p, no_decay_module), layer in zip(entries, ids):
        if not p.requires_grad:
            continue
        group = next((g for g in cfg.param_groups if matching(g.match, full)), None)
        scale = (group.lr / cfg.lr) if group is not None and group.lr is not None else 1.0
        if cfg.layer_decay is not None:
            scale *= cfg.layer_decay ** (depth + 1 - layer)
        if group is not None and group.weight_decay is not None:
            decay = group.weight_decay
        else:
            skip = p.ndim < 2 or no_decay_module or any(key in full for key in _NO_DECAY_NAMES)
            decay = 0.0 if skip else cfg.weight_decay
        buckets.setdefault((scale, decay), []).append(p)
    return [{"params": params, "weight_decay": decay, "lr_scale": scale, "lr": cfg.lr * scale}
            for (scale, decay), params in buckets.items()]


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
    groups = param_groups(model, cfg)
    if not groups:
        raise UserError(EVERYTHING_FROZEN, public=True)
    return factory(groups, cfg, on_accelerator)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The scheduled LR for this step, times each group's `lr_scale` (param groups, layer decay)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
