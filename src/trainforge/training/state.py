"""The loop's changing state, as one value that goes into a checkpoint and comes back out of it.

    state = TrainState(setup, scaler, ema=EMA(model, 0.999), stopper=EarlyStopper(...))
    payload, groups = state.to_checkpoint(run_facts)        # state.pt's dict; the EMA and best weights apart
    state = TrainState.from_checkpoint(payload, groups, setup, scaler, ema=..., stopper=..., rank=env.rank)

`payload` holds only tensors, numbers, strings, lists and dicts (torch.load with weights_only=True reads it);
its keys are those every checkpoint since the first has had, so old checkpoints resume. `groups` (the EMA
shadow and the best weights) are stored by the strategy the way it stores the model: whole in state.pt, or
as shards (`training.strategy`). RNG states come back last, after everything else is restored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import torch

from trainforge.engine.early_stop import EarlyStopper
from trainforge.engine.ema import EMA
from trainforge.engine.rng import set_rng_state
from trainforge.training.setup import RunSetup
from trainforge.layout import CONFIG_TEXT


@dataclass(frozen=True)
class RunFacts:
    """What a checkpoint records so it can be evaluated, resumed or compressed without the recipe."""

    seed: int
    config_yaml: str
    data_info: Mapping[str, Any]
    preprocess: Mapping[str, Any]
    base: Optional[Mapping[str, Any]] = None  # LoRA: the frozen base's source and SHA-256 (models.lora)


@dataclass
class TrainState:
    setup: RunSetup  # the setup in force: a step that runs out of memory replaces it with a smaller one
    scaler: torch.amp.GradScaler
    ema: Optional[EMA] = None
    stopper: Optional[EarlyStopper] = None
    step: int = 0  # optimizer steps done
    skipped_steps: int = 0  # non-finite losses, in all
    bad_steps_in_row: int = 0
    best: dict[str, torch.Tensor] = field(default_factory=dict)  # weights of the best evaluation (early stopping)
    status: str = "completed"  # completed | early_stopped | interrupted | pruned
    val: dict[str, Any] = field(default_factory=dict)  # the last validation metrics

    @property
    def epoch(self) -> int:
        return self.step // self.setup.steps_per_epoch

    def chosen_weights(self) -> Optional[dict[str, torch.Tensor]]:
        """The final model's weights, in order of preference: best (early stopping) > EMA > None (the last)."""
        if self.best:
            return self.best
        return self.ema.shadow if self.ema is not None else None

    def to_checkpoint(self, facts: RunFacts, rng_ranks: list) -> tuple[dict[str, Any], dict[str, dict]]:
        """(state.pt payload, weight groups). `rng_ranks`: every rank's RNG state, gathered on rank 0."""
        setup = self.setup
        payload = {
            "step": self.step,
            "epoch": self.epoch,
            "start_sample": (self.step % setup.steps_per_epoch) * setup.global_batch_size,
            "sampler_seed": facts.seed,
            "micro_batch_size": setup.micro_batch_size,
            "accumulation": setup.accumulation,
            "scaler": self.scaler.state_dict(),
            "early_stop": self.stopper.state_dict() if self.stopper else {},
            "skipped_steps": self.skipped_steps,
            "bad_steps_in_row": self.bad_steps_in_row,
            "rng": rng_ranks[0] if rng_ranks else {},  # gathered on rank 0 only
            "rng_ranks": rng_ranks,
            "world_size": setup.world_size,
            CONFIG_TEXT: facts.config_yaml,
            "data_info_json": json.dumps(dict(facts.data_info)),
            "preprocess_json": json.dumps(dict(facts.preprocess)),
            "base_json": json.dumps(dict(facts.base) if facts.base else None),
        }
        groups = {"ema": self.ema.state_dict() if self.ema else {}, "best_model": self.best}
        return payload, groups

    @classmethod
    def from_checkpoint(cls, payload: Mapping[str, Any], groups: Mapping[str, dict], setup: RunSetup,
                        scaler: torch.amp.GradScaler, *, ema: Optional[EMA], stopper: Optional[EarlyStopper],
                        rank: int) -> TrainState:
        """The state a checkpoint continues with; the RNG of this rank is restored last (with the same world
        size every rank continues its own stream exactly; ranks beyond the saved ones keep their fresh seed)."""
        scaler.load_state_dict(payload["scaler"])
        if ema is not None and groups.get("ema"):
            ema.load_state_dict(groups["ema"])
        if stopper is not None and payload["early_stop"]:
            stopper.load_state_dict(payload["early_stop"])
        state = cls(setup, scaler, ema=ema, stopper=stopper, step=int(payload["step"]),
                    skipped_steps=int(payload["skipped_steps"]), bad_steps_in_row=int(payload["bad_steps_in_row"]),
                    best=dict(groups.get("best_model") or {}))
        rank_states = payload.get("rng_ranks") or [payload["rng"]]
        if rank < len(rank_states):
            set_rng_state(rank_states[rank])
        return state

    def templates(self, model_state: dict[str, torch.Tensor], snapshot) -> dict[str, Optional[dict]]:
        """This run's tensors of each weight group it keeps, for a checkpoint to be loaded into (None: not kept).
        `snapshot` copies `model_state` the way the strategy keeps best weights."""
        return {"ema": self.ema.shadow if self.ema is not None else None,
                "best_model": snapshot(model_state) if self.stopper is not None else None}
