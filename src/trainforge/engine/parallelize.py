"""Apply activation checkpointing and FSDP2 to a model that knows nothing of them.

    model = apply_activation_checkpointing(model)          # 1. recompute each block in backward
    model = apply_fsdp(model, mesh, param_dtype=torch.bfloat16)   # 2. shard each block, then the root

Order matters: activation checkpointing -> FSDP/DDP -> compile (`training.strategy.Strategy.wrap`): checkpointing
wraps the blocks before they are sharded, and compile sees the whole parallel step, DDP's bucketed all-reduce and
FSDP's gathers included (compiling first and wrapping the compiled module would hide the blocks from both).

Both find the model's *repeated blocks* with one rule (`find_blocks`): a child of an
`nn.ModuleList` or `nn.Sequential` that has children of its own and whose class occurs at least
twice among its siblings. That picks transformer blocks (gpt, vit, hybrid, text_transformer) and
residual blocks (resnet), and nothing in flat stacks of single layers (cnn, mlp), where
checkpointing one conv or linear at a time would save nothing. The search does not descend into
a block once found, so nested containers inside a block are never wrapped twice.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Callable, ContextManager, Iterator

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper


def find_blocks(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """The repeated blocks of `model` as (parent container, child name, block), outermost first."""
    found: list[tuple[nn.Module, str, nn.Module]] = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            counts = Counter(type(child) for child in module.children())
            blocks = [
                (name, child)
                for name, child in module.named_children()
                if counts[type(child)] >= 2 and next(child.children(), None) is not None
            ]
            if blocks:
                found.extend((module, name, child) for name, child in blocks)
                for name, child in module.named_children():
                    if all(child is not b for _, b in blocks):
                        visit(child)
                return
        for child in module.children():
            visit(child)

    visit(model)
    return found


# Context factories entered around every recompute (see `observe_recompute`); empty in training.
_RECOMPUTE_OBSERVERS: list[Callable[[], ContextManager]] = []


@contextlib.contextmanager
def observe_recompute(make_context: Callable[[], ContextManager]) -> Iterator[None]:
    """While active, each activation recompute in backward runs inside a fresh `make_context()`.

    The FLOP counter uses it to tell recomputed forward FLOPs (hardware only) from backward ones.
    """
    _RECOMPUTE_OBSERVERS.append(make_context)
    try:
        yield
    finally:
        _RECOMPUTE_OBSERVERS.remove(make_context)


@contextlib.contextmanager
def _recompute_scope() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for make_context in list(_RECOMPUTE_OBSERVERS):
            stack.enter_context(make_context())
        yield


def _checkpoint_contexts() -> tuple[ContextManager, ContextManager]:
    # torch.utils.checkpoint's context_fn: (around the original forward, around the recompute)
    return contextlib.nullcontext(), _recompute_scope()


def apply_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Wrap each repeated block so its activations are recomputed in backward instead of stored.

    Uses torch's non-reentrant `checkpoint_wrapper`; state_dict keys are unchanged (the wrapper
    strips its own prefix). Returns the same `model`, modified in place. Caveat: BatchNorm inside a
    checkpointed block updates its running statistics twice per step (forward and recompute).
    """
    for parent, name, block in find_blocks(model):
        wrapped = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=_checkpoint_contexts)
        if isinstance(parent, nn.ModuleList):
            parent[int(name)] = wrapped
        else:
            setattr(parent, name, wrapped)
    return model


def apply_fsdp(
    model: nn.Module,
    mesh,
    *,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """Shard `model` over `mesh` with FSDP2: `fully_shard` on each repeated block, then the root.

    `param_dtype` (e.g. bf16) is the dtype parameters are all-gathered and computed in; master
    weights, gradients after reduce-scatter and optimizer state stay in the parameters' own dtype.
    Sharding per block means only one block's full parameters are gathered at a time.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # heavy (torch.distributed.fsdp): only FSDP runs load it

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for _, _, block in find_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
