"""Resizing a freshly built model's layers to the shapes of structurally pruned weights.

    model, _ = build_model(cfg.model, info)
    resize_to_weights(model, weights)       # then load_model_weights(model, weights)

Structured pruning removes whole channels, so each pruned layer keeps its type and only its sizes
change. This replaces every parameter and buffer whose saved shape differs by an empty tensor of the
saved shape and updates the size attributes the layer types keep (Conv, Linear, BatchNorm, LayerNorm,
Embedding), the same attributes the pruner edited. Values come from the weights loaded next.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import nn

from trainforge.errors import UserError


def resize_to_weights(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        changed = False
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            saved = weights.get(prefix + name)
            if saved is None or saved.shape == tensor.shape:
                continue
            if saved.dim() != tensor.dim():
                raise UserError(f"{prefix + name}: saved weights of shape {tuple(saved.shape)} cannot be a pruned "
                                f"{tuple(tensor.shape)}; the checkpoint belongs to another architecture")
            empty = torch.empty(saved.shape, dtype=tensor.dtype, device=tensor.device)
            if isinstance(tensor, nn.Parameter):
                setattr(module, name, nn.Parameter(empty, requires_grad=tensor.requires_grad))
            else:
                module.register_buffer(name, empty)
            changed = True
        if changed:
            _update_sizes(module)


def _update_sizes(module: nn.Module) -> None:
    if isinstance(module, nn.modules.conv._ConvNd):
        module.out_channels = module.weight.shape[0]
        module.in_channels = module.weight.shape[1] * module.groups
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, nn.modules.batchnorm._NormBase):
        module.num_features = (module.weight if module.weight is not None else module.running_mean).shape[0]
    elif isinstance(module, nn.LayerNorm):
        module.normalized_shape = tuple(module.weight.shape)
    elif isinstance(module, nn.Embedding):
        module.num_embeddings, module.embedding_dim = module.weight.shape
