"""Model and optimizer state in and out of checkpoints, the same way for every strategy.

Both go through torch.distributed.checkpoint's state-dict API, so optimizer state is keyed by parameter
name (not position) and a checkpoint written by N processes loads on M: plain and DDP runs store whole
tensors (rank 0 writes model.safetensors, the optimizer in state.pt); FSDP runs store shards with
torch.distributed.checkpoint, which reshards on load.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainforge.training.checkpoint import is_sharded, load_checkpoint, load_model_weights, load_sharded_into, load_state

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def current_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model, optimizer) state dicts: shards under FSDP, whole tensors otherwise."""
    return get_model_state_dict(model), get_optimizer_state_dict(model, optimizer)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Whole weights on the CPU (a collective under FSDP: every rank must call it)."""
    return get_model_state_dict(model, options=FULL)


def restore(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, sharded_model: bool) -> dict[str, Any]:
    """Load weights and optimizer state from checkpoint `path` into this run's (possibly sharded) model;
    returns the rest of the checkpoint's state."""
    if is_sharded(path):
        state = load_state(path)
        model_sd, optim_sd = current_state(model, optimizer)
        tensors = {"model": model_sd, "optimizer": optim_sd}
        load_sharded_into(path, tensors)
        set_model_state_dict(model, tensors["model"])
        set_optimizer_state_dict(model, optimizer, tensors["optimizer"])
        return state
    weights, state = load_checkpoint(path)
    if sharded_model:  # whole tensors into shards: every rank reads the file and keeps its part
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=StateDictOptions(full_state_dict=True))
    else:
        load_model_weights(model, weights)
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    return state
