"""The pre-flight of a run: its data and model built, and what a run would refuse at its start refused before any
work, the same way for every command that needs it (train, the torchrun launcher, plan, tune, the job admission).

    pre = preflight(cfg, world_size=2, fit_stats=False, on_meta=True)   # a check: no statistics, no weights
    pre.data, pre.model, pre.facts          # DataBundle, nn.Module (meta device), DataFacts for the resolver
    pre = preflight(cfg, world_size=env.world_size, stored=saved_preprocess)   # a run: real weights, its tokenizer

It refuses, with one line naming the field: a pruned model without the skeleton `trainforge compress` rebuilds, an
early-stopping metric the task does not report, a `train.freeze` pattern that matches nothing (or everything),
and whatever the data sources and the model factory refuse.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch
from torch import nn

from trainforge.config import Config, OptimConfig
from trainforge.data import build_data
from trainforge.data.base import DataBundle, DataInfo
from trainforge.data.stages.loader import epoch_samples
from trainforge.engine.optim import freeze
from trainforge.engine.parallelize import find_blocks
from trainforge.errors import UserError
from trainforge.models import build_model, is_convolutional
from trainforge.tasks import TASKS


@dataclass(frozen=True)
class ModelFacts:
    """What the planner needs to know about the architecture, read once by the pre-flight from the model it built."""

    family: str  # transformer | conv | other
    convolutional: bool
    param_count: int
    state_bytes_per_param: int  # fp32 weights + fp32 gradients + optimizer state of a trained parameter
    trainable_count: Optional[int] = None  # parameters that train (None: all of them)
    frozen_bytes: int = 0  # the frozen weights (`train.freeze`, a LoRA base), in their dtype: no gradient, no state
    adapters: bool = False  # LoRA: adapters train on a base the model itself freezes
    # frozen Linear weights of the repeated blocks: what QLoRA quantizes (elements, bytes, largest one's elements)
    block_linear: tuple[int, int, int] = (0, 0, 0)

    def floor_bytes(self, shards: int) -> float:
        """Weights, gradients and optimizer state before any activation: the floor of a step. The trained state
        is sharded over `shards` (FSDP); frozen weights are not: the simulation holds them as buffers, which
        FSDP2 leaves whole."""
        trainable = self.param_count if self.trainable_count is None else self.trainable_count
        return trainable * self.state_bytes_per_param / shards + self.frozen_bytes


OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4}  # two fp32 moments; one fp32 momentum buffer (0 without momentum)


def describe_model(model: nn.Module, optim: OptimConfig, adapters: bool) -> ModelFacts:
    """What the planner's simulation and corrections need of `model`, as the pre-flight built it (train.freeze
    applied, before any wrapping); `optim` sizes the state of each trained parameter."""
    attention = any("attention" in type(m).__name__.lower() for m in model.modules())
    conv = is_convolutional(model)
    family = "transformer" if attention else ("conv" if conv else "other")
    params = list(model.parameters())  # a tied tensor once
    frozen = [p for p in params if not p.requires_grad]
    linear = frozen_block_linear_weights(model)
    optim_state = OPTIMIZER_STATE_BYTES.get(optim.name, 8)
    if optim.name == "sgd" and optim.momentum == 0:
        optim_state = 0
    return ModelFacts(
        family, conv, sum(p.numel() for p in params), 4 + 4 + optim_state,
        trainable_count=sum(p.numel() for p in params if p.requires_grad),
        frozen_bytes=sum(p.numel() * p.element_size() for p in frozen),
        adapters=adapters,
        block_linear=(sum(w.numel() for w in linear), sum(w.numel() * w.element_size() for w in linear),
                      max((w.numel() for w in linear), default=0)),
    )


def frozen_block_linear_weights(model: nn.Module) -> list[torch.Tensor]:
    """The frozen `nn.Linear` weights inside the model's repeated blocks (`find_blocks`), each once: what QLoRA
    stores quantized. PEFT's LoRA layers keep the base Linear as `base_layer` (frozen) and the adapters as Linear
    layers that train, so the adapters are left out; so are embeddings, the output head and biases."""
    weights: dict[int, torch.Tensor] = {}
    for _, _, block in find_blocks(model):
        for module in block.modules():
            if isinstance(module, nn.Linear) and not module.weight.requires_grad:
                weights[id(module.weight)] = module.weight
    return list(weights.values())


@dataclass(frozen=True)
class DataFacts:
    """What the resolver needs to know of the data and the model, read once they are built."""

    info: DataInfo
    train_samples: int  # read in one epoch over all ranks (`epoch_samples`: sharded data deals out whole shards)
    convolutional: bool  # has Conv2d layers: channels_last pays off on CUDA
    model: Optional[ModelFacts] = None  # what the planner reads of the model (`auto`, a reservation): read here once
    train_class_counts: Optional[tuple[int, ...]] = None  # samples of each class in the train split (classification)


@dataclass(frozen=True)
class Preflight:
    data: DataBundle
    model: nn.Module
    facts: DataFacts
    frozen_params: int = 0  # by train.freeze
    total_params: int = 0


def preflight(cfg: Config, *, world_size: int = 1, fit_stats: bool = True, stored: Optional[Mapping[str, Any]] = None,
              on_meta: bool = False, model_factory: Optional[Callable[[DataInfo], nn.Module]] = None) -> Preflight:
    """Build the data (`fit_stats`: the normalization statistics too; `stored`: a resumed run's preprocessing) and the
    model (`on_meta`: on the meta device, no memory and no weights; a custom model, the user's own code, that fails
    there is built on the CPU; `model_factory`: a replacement for the zoo's, e.g. a pruned skeleton), freeze what
    train.freeze names, and check what every run of `cfg` on `world_size` processes would refuse at its start."""
    data = build_data(cfg.data, seed=cfg.seed, fit_stats=fit_stats, stored=stored)
    if cfg.stage.pruned and model_factory is None:
        raise UserError("stage.pruned: this run fine-tunes a pruned model that `trainforge compress` builds; rerun the "
                        "same compress command (same --out) to continue it")
    model = _build(cfg, data.info, on_meta, model_factory)
    frozen, total = freeze(model, cfg.train.freeze) if cfg.train.freeze else (0, 0)  # before any wrapping or optimizer
    if cfg.train.loss is not None:
        TASKS.get(data.info.task).check_loss(cfg.train.loss, "train.loss")
    if cfg.train.early_stopping is not None:
        if cfg.train.early_stopping.metric is not None:  # None: the task's default, which it reports
            TASKS.get(data.info.task).check_metric(cfg.train.early_stopping.metric, "train.early_stopping.metric")
    counts = None
    if cfg.train.class_weights is not None:
        counts = check_class_weights(cfg.train.class_weights, data)
    facts = DataFacts(data.info, epoch_samples(data.train, world_size), is_convolutional(model),
                      describe_model(model, cfg.optim, adapters=cfg.model.lora is not None), counts)
    return Preflight(data, model, facts, frozen, total)


def check_class_weights(weights: Any, data: DataBundle) -> tuple[int, ...]:
    """train.class_weights fits the data (a task that weighs classes; a list of one positive weight per class), else
    a UserError; returns the train split's count of each class."""
    task = TASKS.get(data.info.task)
    counts = (data.report.get("class_counts") or {}).get("train")
    if not task.class_weighted or not isinstance(counts, dict):
        raise UserError(f"train.class_weights: a {task.title} run has no class weights; remove the setting")
    names = list(data.info.class_names)
    if isinstance(weights, list) and (len(weights) != len(names) or any(not w > 0 for w in weights)):
        raise UserError(f"train.class_weights: give one positive weight per class ({len(names)}: "
                        f"{', '.join(names[:10])}{' ...' if len(names) > 10 else ''}) or auto; got {len(weights)}")
    return tuple(int(counts.get(name, 0)) for name in names)


def check_model(cfg: Config, info: DataInfo) -> None:
    """A config variant's model checked on the meta device (tune's search space, value by value): the zoo's refusal
    is a UserError; code that cannot run on the meta device is left for the run to try."""
    try:
        with torch.device("meta"):
            build_model(cfg.model, info)
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - a user's factory may not support the meta device; the trial will tell
        pass


def _build(cfg: Config, info: DataInfo, on_meta: bool, factory: Optional[Callable[[DataInfo], nn.Module]]) -> nn.Module:
    build = factory or (lambda i: build_model(cfg.model, i)[0])
    if not on_meta:
        return build(info)
    try:
        with torch.device("meta"):
            return build(info)
    except UserError:
        if cfg.model.name != "custom":  # the zoo's own verdict on the config
            raise
    except Exception:  # noqa: BLE001 - code that cannot run on the meta device says nothing of the input
        pass
    return build(info)  # for real, on the CPU: what the run itself will do
