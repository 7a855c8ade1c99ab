"""How the processes of a run share the work — `none`, `ddp`, `fsdp` — behind one interface, so the loop
has no `if strategy == ...`.

    strategy = STRATEGIES.get(setup.strategy)(setup.env, setup.device)
    step_model = strategy.wrap(model, setup)            # activation checkpointing -> DDP | FSDP2 -> compile
    with strategy.micro_batch(last=...): ...            # each micro-batch's forward and backward
    with strategy.synced_backward(): loss.backward()    # the step's one backward that communicates
    strategy.out_of_memory(run_dir, micro, step, communicating=False)   # returns: agree in place; raises: restart
    strategy.save(root, step, model, optimizer, state, groups, keep)    # one checkpoint (every rank calls it)
    state, groups = strategy.restore(path, model, optimizer, templates)  # any strategy's checkpoint, any world size
    whole = strategy.whole_weights(model, chosen)       # the final weights on the CPU (a collective under FSDP)

`model` stays the plain module that owns the weights (state dicts, the optimizer, EMA, evaluation on rank 0);
`step_model` is what a training step calls. `groups` are the run's other weight-shaped state — the EMA weights
and the best weights of early stopping — which each strategy stores the way it stores the model: whole
tensors in state.pt (none, ddp: replicas are identical, rank 0 writes), shards with
torch.distributed.checkpoint (fsdp: every rank writes its part, and resharding to another world size or to
one process happens on load).

Out of memory: the ranks agree once per step, after every forward and every backward that communicates
nothing, and before the one backward that does. An out-of-memory error before that point is agreed in place
(all ranks shrink the micro-batch and retry the step). After it — inside DDP's communicating backward, or
anywhere under FSDP, whose forward gathers parameters — another rank may be waiting in a collective, so the
failing rank records the micro-batch that failed (`oom_restart.json`) and fails; torchrun ends the others and
restarts the group, which resumes from the last checkpoint with a smaller micro-batch. No rank is left waiting.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ContextManager, Iterator, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from trainforge.engine.data_parallel import OverlappedAllReduce, barrier, broadcast_state
from trainforge.engine.env import DistEnv
from trainforge.engine.parallelize import apply_activation_checkpointing, apply_fsdp
from trainforge.registry import Registry
from trainforge.models.lora import adapter_names
from trainforge.engine.checkpoint import (
    is_sharded,
    kept_weights,
    load_checkpoint,
    load_model_weights,
    load_sharded_into,
    read_state,
    save_checkpoint,
    save_sharded_checkpoint,
    STATE_FILE,
)
from trainforge.engine.microbatch import request_oom_restart
from trainforge.engine.precision import DTYPES
from trainforge.training.setup import RunSetup

WHOLE = StateDictOptions(full_state_dict=True, cpu_offload=True)
GROUPS = ("ema", "best_model")  # weight-shaped state besides the model, stored like the model
SHARDED_GROUPS = "sharded_groups"  # in a sharded checkpoint's state.pt: the groups its shards hold

Tensors = dict[str, torch.Tensor]


class Strategy:
    """One process, or replicas that need no communication: the base every strategy refines."""

    name = "none"
    every_rank_evaluates = False  # True when a forward pass is a collective (FSDP gathers parameters)

    def __init__(self, env: DistEnv, device: torch.device) -> None:
        self.env, self.device = env, device

    # ---- wrapping: activation checkpointing -> data parallelism -> compile
    def wrap(self, model: nn.Module, setup: RunSetup) -> nn.Module:
        """The module a training step calls: activation checkpointing, FSDP and DDP's gradient hooks change
        `model` in place; compile wraps it last."""
        if setup.activation_checkpointing:
            apply_activation_checkpointing(model)
        wrapped = self.parallelize(model, setup)
        return torch.compile(wrapped) if setup.compile else wrapped

    def parallelize(self, model: nn.Module, setup: RunSetup) -> nn.Module:
        return model

    def micro_batch(self, last: bool) -> ContextManager:
        """Around each micro-batch's forward and backward (FSDP: reduce-scatter in the last backward only)."""
        return contextlib.nullcontext()

    def synced_backward(self) -> ContextManager:
        """Around the step's one backward that communicates (the last micro-batch's, after the agreement)."""
        return contextlib.nullcontext()

    def evaluating(self, model: nn.Module) -> ContextManager:
        """Around forward passes without backward (evaluation)."""
        return contextlib.nullcontext()

    # ---- out of memory
    def out_of_memory(self, run_dir: Path, micro_batch_size: int, step: int, communicating: bool) -> None:
        """Returns when the ranks can agree in place and retry the step smaller; raises JobFailed (after asking
        for a restart of the group with a smaller micro-batch) when another rank may be inside a collective."""
        if communicating and self.env.is_distributed:
            request_oom_restart(run_dir, micro_batch_size, step, self.name.upper())

    # ---- checkpoints
    def snapshot(self, state_dict: Tensors) -> Tensors:
        """A copy of weights kept aside (the best so far): on the CPU, off the accelerator."""
        return {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}

    def save(self, root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             state: dict[str, Any], groups: dict[str, Tensors], keep: int) -> None:
        """Every rank calls it; rank 0 writes whole tensors (replicas are identical); all leave once it is complete."""
        model_sd, optim_sd = kept_weights(model, get_model_state_dict(model)), get_optimizer_state_dict(model, optimizer)
        if self.env.is_main:
            whole = {name: {k: v.detach().cpu() for k, v in groups[name].items()} for name in GROUPS}
            save_checkpoint(root, step, model_sd, {**state, **whole, "optimizer": optim_sd}, keep=keep)
        barrier(self.env)

    def restore(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                templates: dict[str, Optional[Tensors]]) -> tuple[dict[str, Any], dict[str, Tensors]]:
        """(state, groups) of the verified checkpoint `path`, whichever strategy and world size wrote it; model
        and optimizer are loaded in place. `templates`: this run's tensors of each group it keeps (None: it
        keeps none), filled from the checkpoint."""
        if is_sharded(path):
            state = read_state(path / STATE_FILE)
            wanted = {name: t for name, t in templates.items() if t is not None and name in state.get(SHARDED_GROUPS, ())}
            tensors = {"model": kept_weights(model, get_model_state_dict(model)),
                       "optimizer": get_optimizer_state_dict(model, optimizer), **wanted}
            load_sharded_into(path, tensors)
            set_model_state_dict(model, tensors["model"], options=StateDictOptions(strict=adapter_names(model) is None))
            set_optimizer_state_dict(model, optimizer, tensors["optimizer"])
            return state, {name: tensors[name] for name in wanted}
        weights, state = load_checkpoint(path, verify=False)  # the run verified it before resolving its setup
        self.load_whole(model, optimizer, weights, state["optimizer"])
        groups = {name: self.from_whole(state.get(name) or {}, t) for name, t in templates.items() if t is not None}
        return state, {name: g for name, g in groups.items() if g}

    def load_whole(self, model: nn.Module, optimizer: torch.optim.Optimizer, weights: Tensors, optim_sd: dict) -> None:
        load_model_weights(model, weights)
        set_optimizer_state_dict(model, optimizer, optim_sd)

    def from_whole(self, whole: Tensors, template: Tensors) -> Tensors:
        """A group saved as whole tensors, laid out like this run's `template`."""
        return dict(whole)

    # ---- the end
    def whole_weights(self, model: nn.Module, chosen: Optional[Tensors]) -> Tensors:
        """The final weights on the CPU: the model's, with `chosen` (best or EMA weights) in place of its own."""
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        weights.update({k: v.detach().cpu() for k, v in (chosen or {}).items()})
        return weights


STRATEGIES: Registry[type[Strategy]] = Registry("strategy", "distributed.strategy")
STRATEGIES.register("none")(Strategy)


@STRATEGIES.register("ddp")
class DDP(Strategy):
    """Replicas: every rank starts from rank 0's weights and buffers; gradients are averaged in ~25 MiB buckets,
    each all-reduced while backward is still running, as soon as its gradients are ready
    (`engine.data_parallel.OverlappedAllReduce`: DDP's scheme, without the collectives that DDP's own
    forward may hold). Earlier micro-batches of an accumulated step only accumulate. Buffers (BatchNorm
    statistics) are not synchronized: each rank keeps its own and rank 0's are saved, as with DDP's
    `broadcast_buffers=False`."""

    name = "ddp"

    def parallelize(self, model: nn.Module, setup: RunSetup) -> nn.Module:
        broadcast_state(model, self.env)
        self.buckets = OverlappedAllReduce(model, self.env)
        return model

    def synced_backward(self) -> ContextManager:
        return self.buckets.syncing()


@STRATEGIES.register("fsdp")
class FSDP(Strategy):
    """Shards with FSDP2 (`fully_shard` per repeated block, then the root): parameters, gradients, optimizer,
    EMA and best weights are each rank's part; the gradient reduce-scatter runs in the last micro-batch's
    backward. Every rank evaluates (forward gathers parameters), and the final weights are gathered once."""

    name = "fsdp"
    every_rank_evaluates = True

    def parallelize(self, model: nn.Module, setup: RunSetup) -> nn.Module:
        broadcast_state(model, self.env)  # shards are cut from rank 0's initial weights
        # the mesh reuses the default process group: a new group would leave rendezvous keys behind that a
        # torchrun restart of the group then trips over
        mesh = DeviceMesh.from_group(dist.group.WORLD, self.device.type)
        self.root = apply_fsdp(model, mesh, param_dtype=None if setup.precision == "fp32" else DTYPES[setup.precision])
        return model

    def micro_batch(self, last: bool) -> ContextManager:
        self.root.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def evaluating(self, model: nn.Module) -> Iterator[None]:
        """Without a backward, the root keeps its gathered parameters after forward; the next training forward
        would then reuse them (stale once the EMA swap is undone) instead of gathering the shards again, and
        a state dict would see them instead of the shards. Reshard everything on the way out."""
        try:
            yield
        finally:
            for module in model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def out_of_memory(self, run_dir: Path, micro_batch_size: int, step: int, communicating: bool) -> None:
        request_oom_restart(run_dir, micro_batch_size, step, "FSDP")  # forward gathers parameters: never in place

    def snapshot(self, state_dict: Tensors) -> Tensors:
        return {k: v.detach().clone() for k, v in state_dict.items()}  # shards stay where they are: 1/N each

    def save(self, root: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             state: dict[str, Any], groups: dict[str, Tensors], keep: int) -> None:
        kept = {name: g for name, g in groups.items() if g}
        tensors = {"model": kept_weights(model, get_model_state_dict(model)),
                   "optimizer": get_optimizer_state_dict(model, optimizer), **kept}
        state = {**state, **{name: {} for name in GROUPS}, SHARDED_GROUPS: sorted(kept)}
        save_sharded_checkpoint(root, step, tensors, state, keep, is_main=self.env.is_main,
                                barrier=lambda: barrier(self.env))

    def load_whole(self, model: nn.Module, optimizer: torch.optim.Optimizer, weights: Tensors, optim_sd: dict) -> None:
        # whole tensors into shards: every rank reads the file and keeps its part
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))
        set_optimizer_state_dict(model, optimizer, optim_sd, options=StateDictOptions(full_state_dict=True))

    def from_whole(self, whole: Tensors, template: Tensors) -> Tensors:
        out = {}
        for k, v in whole.items():
            like = template.get(k)
            if isinstance(like, DTensor):  # every rank holds the whole tensor: each keeps its part, no communication
                out[k] = distribute_tensor(v.to(like.device, like.dtype), like.device_mesh, like.placements,
                                           src_data_rank=None)
            else:
                out[k] = v.to(like.device) if like is not None else v
        return out

    def whole_weights(self, model: nn.Module, chosen: Optional[Tensors]) -> Tensors:
        weights = get_model_state_dict(model, options=WHOLE)  # a collective: every rank calls it
        for k, v in (chosen or {}).items():  # the same keys in the same order on every rank
            weights[k] = (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
        return weights
