"""Structured pruning that shrinks the network: whole channels go, so parameters and FLOPs fall.

    result = prune_model(model, example, ratio=0.5)   # PruneResult: pruned model, params/FLOPs before and after

torch-pruning's dependency graph finds every layer coupled to a channel (the next conv's input, its
BatchNorm, a residual branch) and removes them together. What may be pruned is the width that nothing
outside a block sees: convolution channels, and the hidden width of a Transformer's feed-forward layers.
The residual stream, attention projections (whose width the heads divide), embeddings and the classifier
keep their shapes, so the pruned model takes the same inputs and gives the same outputs.
Channels are ranked by the L2 norm of their group's weights (GroupMagnitudeImportance).

Where pruning does not apply, `prune_model` raises `PruningUnsupported` (a UserError) with one line saying why
and what to use instead; `compress` then skips the pruned variants and writes the others. That is the case for
Hugging Face transformers models (`model.name: hf`: their attention and config keep fixed widths, so a pruned
model could not be saved or reloaded as one), for a model with nothing prunable (an MLP, or every prunable width
coupled to one that must stay), and for an architecture torch-pruning cannot trace or resize consistently (the
pruned copy fails to run or changes its output shape; e.g. timm's NFNets). timm's networks prune like the zoo's:
their convolutions (ResNets, EfficientNets, ...) and the hidden width of their `Mlp` blocks (ViTs, ConvNeXts).
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from trainforge.errors import UserError
from trainforge.models.hf import HFModel
from trainforge.models.transformer import FeedForward


class PruningUnsupported(UserError):
    """This model cannot be pruned; the message is one line: why, and what to use instead."""


INSTEAD = "the other variants are still written; for a smaller model train a smaller architecture"
TP_FAILURES = (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError, AssertionError,
               NotImplementedError)  # what torch-pruning raises on a graph it cannot follow


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
    check_prunable(model)
    pruned = copy.deepcopy(model).cpu().eval()
    example = example[:1].cpu()
    output_layer = last_layer_run(pruned, example)
    roots = [m for m in prunable_layers(pruned) if m is not output_layer]  # a segmenter's classes stay its classes
    if not roots:
        raise PruningUnsupported(f"--prune: {type(model).__name__} has no convolution or feed-forward channels to "
                                 f"prune; pruning skipped ({INSTEAD}, or use --prune 0)")
    root_ids = {id(m) for m in roots}
    ignored = [m for m in pruned.modules() if isinstance(m, (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d))
               and id(m) not in root_ids]
    flops_before, params_before = count(pruned, example)
    with torch.no_grad():
        expected = pruned(example).shape
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "unwrapped parameters": position tables sit on the kept width
            pruner = tp.pruner.BasePruner(
                pruned, example, importance=tp.importance.GroupMagnitudeImportance(p=2),
                pruning_ratio=ratio, ignored_layers=ignored,
            )
            pruner.step()
            with torch.no_grad():
                shape = pruned(example).shape
        if shape != expected:
            raise ValueError(f"the pruned model's output has shape {tuple(shape)}, not {tuple(expected)}")
        flops_after, params_after = count(pruned, example)
    except TP_FAILURES as e:
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise PruningUnsupported(f"--prune: torch-pruning cannot prune {type(model).__name__} consistently ({why}); "
                                 f"pruning skipped ({INSTEAD}, or use --prune 0)") from None
    if params_after >= params_before:
        raise PruningUnsupported(f"--prune: nothing in {type(model).__name__} could be pruned (its convolutions "
                                 f"and feed-forward layers are coupled to widths that must stay); pruning skipped "
                                 f"({INSTEAD}, or use --prune 0)")
    return PruneResult(pruned, ratio, params_before, params_after, flops_before, flops_after)


def last_layer_run(model: nn.Module, example: torch.Tensor) -> Optional[nn.Module]:
    """The convolution or Linear that runs last on `example`: the layer whose output channels are the model's outputs
    (a classifier's classes, a segmenter's per-pixel classes, after which only resizing follows), which pruning must
    keep whole."""
    ran: list[nn.Module] = []
    hooks = [m.register_forward_hook(lambda module, _i, _o: ran.append(module)) for m in model.modules()
             if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for hook in hooks:
            hook.remove()
    return ran[-1] if ran else None


def check_prunable(model: nn.Module) -> None:
    """PruningUnsupported for a model family pruning does not support (see module doc)."""
    if isinstance(model, HFModel):
        raise PruningUnsupported(
            "--prune: pruning is not supported for Hugging Face transformers models (model.name: hf): their "
            "attention and config keep fixed widths; pruning skipped (the other variants are still written; "
            "for a smaller model fine-tune a smaller checkpoint, e.g. a distilled one, or a config "
            "with fewer layers or a smaller intermediate_size)")


def prunable_layers(model: nn.Module) -> list[nn.Module]:
    """Convolutions, and the first Linear of each Transformer feed-forward block (its hidden width): the zoo's
    FeedForward and timm's Mlp (its ViTs, ConvNeXts, ...)."""
    convs = [m for m in model.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and m.groups == 1]
    hidden = [m.c_fc for m in model.modules() if isinstance(m, FeedForward)]
    hidden += [m.fc1 for m in model.modules() if is_timm_mlp(m)]
    return convs + hidden


def is_timm_mlp(module: nn.Module) -> bool:
    """timm's `Mlp` (fc1 -> act -> fc2, fc1's outputs seen by nothing else); by name: timm is optional."""
    return (type(module).__name__ == "Mlp" and type(module).__module__.startswith("timm.")
            and isinstance(getattr(module, "fc1", None), nn.Linear) and isinstance(getattr(module, "fc2", None), nn.Linear))


def count(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    """(forward FLOPs per sample, parameters) of `model` on a one-sample `example`."""
    import torch_pruning as tp  # heavy (torch_pruning): loaded only when pruning

    one = tuple(x[:1] for x in example) if isinstance(example, tuple) else example[:1]  # several inputs: a tuple
    with torch.no_grad():
        macs, params = tp.utils.count_ops_and_params(model, one)
    return int(2 * macs), int(params)
