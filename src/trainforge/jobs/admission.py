"""A submission checked like the CLI checks it, frozen into the config the job will run, and sized.

    job = admit(recipe="digits_cnn", recipe_yaml=None, overrides=["train.max_steps=50"], num_gpus=1, slots=slots)
    job.config_yaml     # the resolved config: written to <job>/job.yaml and run as the job's recipe
    job.memory_bytes    # the planner's predicted peak per device, reserved on each slot the job gets
    job.total_steps     # for the dashboard's progress and ETA

Validation is the CLI's: the recipe's YAML, the KEY=VALUE overrides and the registry names, each problem a
UserError with one line (the API answers 400 with it). The recipe is a built-in name or YAML text sent by
the client; the server never reads a path it was sent. Custom code (`model.name: custom`, `data.source:
custom`) is refused: the API starts recipes, never code of the caller's choosing.

Memory comes from the planner's fake-tensor simulation of one training step on one device
(`planning.plan.Planner`), plus the GPU correction terms (CUDA context, workspaces, allocator) on GPU
slots. `train.micro_batch_size: auto` is pinned here to the largest micro-batch that fits the largest
slot, so the job never grows past what the scheduler reserved for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from trainforge.config import Config, apply_overrides, builtin_recipes, config_from_dict, parse_yaml_mapping, read_yaml
from trainforge.errors import UserError
from trainforge.jobs.scheduler import never_fits
from trainforge.jobs.slots import Slot


@dataclass(frozen=True)
class Admitted:
    name: str
    config_yaml: str
    memory_bytes: int
    total_steps: int
    micro_batch_size: int


def load_submission(recipe: str, recipe_yaml: Optional[str], overrides: Sequence[str]) -> Config:
    """The validated config of a submission (UserError with one line otherwise)."""
    if recipe_yaml is not None:
        raw = parse_yaml_mapping(recipe_yaml, recipe)
    else:
        builtin = builtin_recipes()
        if recipe not in builtin:
            raise UserError(f"recipe: {recipe!r} is not a built-in recipe ({', '.join(builtin)}); "
                            "to run your own file, submit it with `trainforge jobs submit PATH.yaml`")
        raw = read_yaml(builtin[recipe])
    for item in overrides:
        if not isinstance(item, str):
            raise UserError(f"overrides: expected KEY=VALUE strings, got {item!r}")
    cfg = config_from_dict(apply_overrides(raw, list(overrides)))
    if cfg.model.name == "custom" or cfg.model.target:
        raise UserError("model.name: the job server runs the built-in model zoo only, not custom code "
                        "(model.target); run custom models with `trainforge train`")
    if cfg.data.source == "custom" or cfg.data.target:
        raise UserError("data.source: the job server runs the built-in data sources only, not custom code "
                        "(data.target); run custom data with `trainforge train`")
    from trainforge.training.api import check_names

    check_names(cfg)
    return cfg


def admit(*, recipe: str, recipe_yaml: Optional[str], overrides: Sequence[str], num_gpus: int,
          slots: Sequence[Slot]) -> Admitted:
    """Validate, size and freeze a submission; UserError when it is bad or can never fit a slot."""
    cfg = load_submission(recipe, recipe_yaml, overrides)
    capacity = {s.id: s.memory_bytes for s in slots}
    if num_gpus > len(slots):
        raise UserError(never_fits(capacity, 0, num_gpus))
    micro, need, steps = memory_need(cfg, num_gpus, slots[0].kind, max(capacity.values()))
    reason = never_fits(capacity, need, num_gpus)
    if reason:
        raise UserError(f"{cfg.name}: {reason}")
    if cfg.train.micro_batch_size == "auto":
        cfg = config_from_dict(apply_overrides(cfg.model_dump(mode="json"), [f"train.micro_batch_size={micro}"]))
    return Admitted(cfg.name, cfg.to_yaml(), need, steps, micro)


def memory_need(cfg: Config, num_gpus: int, slot_kind: str, largest_slot_bytes: int) -> tuple[int, int, int]:
    """(micro-batch, predicted peak bytes per device, total optimizer steps) for `num_gpus` slots of a kind."""
    from trainforge.planning.corrections import applicable, corrected_peak_bytes
    from trainforge.planning.memory import SimKey, candidate_micro_batches, fit_linear
    from trainforge.planning.plan import Planner
    from trainforge.training.microbatch import accumulation_steps

    global_batch = cfg.train.global_batch_size
    if global_batch % num_gpus:
        raise UserError(f"--gpus: train.global_batch_size ({global_batch}) does not divide over {num_gpus} GPUs; "
                        "change one of them")
    per_device = global_batch // num_gpus
    planner = Planner(cfg)
    terms = applicable("cuda" if slot_kind == "gpu" else "cpu", num_gpus, planner.facts.convolutional)

    def corrected(peak: float) -> int:
        return corrected_peak_bytes(int(peak), terms, None)[0]

    fsdp = num_gpus > 1 and cfg.distributed.strategy == "fsdp"
    precision = "fp32" if cfg.train.precision == "fp32" or (slot_kind == "cpu" and cfg.train.precision == "auto") else "bf16"
    key = SimKey("fsdp" if fsdp else "none", num_gpus if fsdp else 1, cfg.distributed.activation_checkpointing, precision)
    if isinstance(cfg.train.micro_batch_size, int):
        micro = cfg.train.micro_batch_size
        accumulation_steps(global_batch, micro, num_gpus)  # the trainer's own check, before a slot is spent
    else:  # as training's auto does: the linear model proposes, a simulation at that size confirms
        micro = 1
        line = fit_linear(planner.cache.get(key, 1), planner.cache.get(key, 2)) if per_device >= 2 else None
        for b in candidate_micro_batches(per_device):
            if line is not None and corrected(line.at(b)) > largest_slot_bytes:
                continue
            if corrected(planner.cache.get(key, b).peak_bytes) <= largest_slot_bytes:
                micro = b
                break
    return micro, corrected(planner.cache.get(key, micro).peak_bytes), planner.steps
