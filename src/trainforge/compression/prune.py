"""Structured pruning that shrinks the network: whole channels go, so parameters and FLOPs fall.

    result = prune_model(model, example, ratio=0.5)   # PruneResult: pruned model, params/FLOPs before and after

torch-pruning's dependency graph finds every layer coupled to a channel (the next conv's input, its
BatchNorm, a residual branch) and removes them together. What may be pruned is the width that nothing
outside a block sees: convolution channels, and the hidden width of a Transformer's feed-forward layers.
The residual stream, attention projections (whose width the heads divide), embeddings and the classifier
keep their shapes, so the pruned model takes the same inputs and gives the same outputs.
Channels are ranked by the L2 norm of their group's weights (GroupMagnitudeImportance).
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from trainforge.errors import UserError
from trainforge.models.transformer import FeedForward


@dataclass
class PruneResult:
    model: nn.Module
    ratio: float
    params_before: int
    params_after: int
    flops_before: int  # per sample, forward (2 x multiply-accumulates)
    flops_after: int


def prune_model(model: nn.Module, example: torch.Tensor, ratio: float) -> PruneResult:
    """A pruned copy of `model` (the original is untouched) with `ratio` of each prunable width removed."""
    import torch_pruning as tp  # heavy (torch_pruning): loaded only when pruning

    if not 0.0 < ratio < 1.0:
        raise UserError(f"--prune: expected a fraction of channels between 0 and 1 (e.g. 0.5), got {ratio}")
    pruned = copy.deepcopy(model).cpu().eval()
    example = example[:1].cpu()
    roots = prunable_layers(pruned)
    if not roots:
        raise UserError(f"--prune: {type(model).__name__} has no convolution or feed-forward channels to prune; "
                        "use --prune 0 (int8 and export still apply)")
    root_ids = {id(m) for m in roots}
    ignored = [m for m in pruned.modules() if isinstance(m, (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d))
               and id(m) not in root_ids]
    flops_before, params_before = count(pruned, example)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "unwrapped parameters": position tables sit on the kept width
        pruner = tp.pruner.BasePruner(
            pruned, example, importance=tp.importance.GroupMagnitudeImportance(p=2),
            pruning_ratio=ratio, ignored_layers=ignored,
        )
        pruner.step()
    flops_after, params_after = count(pruned, example)
    return PruneResult(pruned, ratio, params_before, params_after, flops_before, flops_after)


def prunable_layers(model: nn.Module) -> list[nn.Module]:
    """Convolutions, and the first Linear of each Transformer feed-forward block (its hidden width)."""
    convs = [m for m in model.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and m.groups == 1]
    hidden = [m.c_fc for m in model.modules() if isinstance(m, FeedForward)]
    return convs + hidden


def count(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    """(forward FLOPs per sample, parameters) of `model` on a one-sample `example`."""
    import torch_pruning as tp  # heavy (torch_pruning): loaded only when pruning

    with torch.no_grad():
        macs, params = tp.utils.count_ops_and_params(model, example[:1])
    return int(2 * macs), int(params)
