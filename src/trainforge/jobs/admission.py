"""A submission checked like the CLI checks it, frozen into the config the job will run, and sized.

    cfg = load_submission("digits_cnn", None, ["train.max_steps=50"], data_roots=roots)  # cheap: no file is read
    job = size_submission(cfg, num_gpus=1, slots=slots)   # reads the data and runs the planner: the costly part
    job.config_yaml     # the resolved config: written to <job>/job.yaml and run as the job's recipe
    job.memory_bytes    # the planner's predicted peak per device, reserved on each slot the job gets
    job.total_steps     # for the dashboard's progress and ETA

Validation is the CLI's: the recipe's YAML, the KEY=VALUE overrides and the registry names, each problem a
UserError with one line (the API answers 400 with it). The recipe is a built-in name or YAML text sent by
the client; the server never reads a path it was sent. Paths a recipe names for its data (`data.path`,
`data.args.root`) must lie under one of the server's data roots (`--data-root`, none by default), judged
before anything is read (`confine.confine`), and so must the pretrained folders and files it names
(`model.args.pretrained`, `model.args.config`, `model.args.weights`, `data.from_model`; `jobs.pretrained`),
whose hub ids must be in the server's caches unless the operator passed `--allow-hub-downloads`. Custom code
(`model.name: custom`, `data.source: custom`) and downloads are refused: the API starts recipes, never code
or network fetches of the caller's choosing.

The service runs `size_submission` in a child process with a time and memory cap (`jobs.sizing`), and a
data problem found there is reported by field only (`errors.public_message`): an API error never quotes a
cell, a header or a line of a file.

The job's setup is resolved by the function every run resolves its setup with (`training.setup.resolve`), on
`num_gpus` devices of the slots' kind: strategy, precision, micro-batch and accumulation as the job will have
them. Memory is the planner's fake-tensor simulation of one training step on one device under that strategy,
plus the GPU correction terms (CUDA context, workspaces, allocator) on GPU slots. `train.micro_batch_size:
auto` is pinned here to the largest micro-batch that fits the largest slot (less the planner's 10% margin), so
the job never grows past what the scheduler reserved for it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence
from urllib.parse import urlparse

from trainforge.config import (Config, apply_overrides, builtin_recipes, config_from_dict, parse_yaml_mapping, read_yaml,
                               recipe_config,
                               set_dotted)
from trainforge.confine import confine, named_paths
from trainforge.engine.env import DistEnv
from trainforge.engine.preflight import DataFacts, preflight
from trainforge.errors import UserError, public_message, quote
from trainforge.hardware.device import resolve_device
from trainforge.jobs.environment import ALLOW_FLAG, uri_allowed
from trainforge.jobs.pretrained import confine_pretrained
from trainforge.jobs.scheduler import never_fits
from trainforge.jobs.slots import Slot
from trainforge.planning.auto import MemoryBudget
from trainforge.planning.plan import quantize_kind, weights_floor_bytes
from trainforge.training.api import check_names
from trainforge.training.setup import RunSetup, resolve
from trainforge.weights import remote_code_fields


@dataclass(frozen=True)
class Admitted:
    name: str
    config_yaml: str
    memory_bytes: int
    total_steps: int
    micro_batch_size: int


def load_submission(recipe: str, recipe_yaml: Optional[str], overrides: Sequence[str], *,
                    data_roots: Sequence[Path] = (), allow_hub_downloads: bool = False,
                    tracking_uri_allow: Sequence[str] = (), allow_remote_code: bool = False) -> Config:
    """The validated config of a submission (UserError with one line otherwise). Reads no file but the
    built-in recipe (and the configs of a pretrained folder it names); every data path and pretrained path is
    confined to `data_roots` (none: no path is accepted), a hub id must be in the local cache unless
    `allow_hub_downloads`, log.mlflow may name only a tracking server of `tracking_uri_allow`, and a recipe may opt
    in to a model's own code (trust_remote_code) only where the operator allows it (`allow_remote_code`)."""
    if recipe_yaml is not None:
        raw = parse_yaml_mapping(recipe_yaml, recipe)
    else:
        builtin = builtin_recipes()
        if recipe not in builtin:
            raise UserError(f"recipe: {quote(recipe)} is not a built-in recipe ({', '.join(builtin)}); "
                            "to run your own file, submit it with `trainforge jobs submit PATH.yaml`")
        raw = read_yaml(builtin[recipe])
    for item in overrides:
        if not isinstance(item, str):
            raise UserError(f"overrides: expected KEY=VALUE strings, got {quote(item)}")
    cfg = recipe_config(raw, list(overrides), "the recipe")
    if cfg.model.name == "custom" or cfg.model.target:
        raise UserError("model.name: the job server runs the built-in model zoo only, not custom code "
                        "(model.target); run custom models with `trainforge train`")
    if cfg.data.source == "custom" or cfg.data.target:
        raise UserError("data.source: the job server runs the built-in data sources only, not custom code "
                        "(data.target); run custom data with `trainforge train`")
    if not allow_remote_code:
        opted = remote_code_fields(cfg.model.name, cfg.model.args, cfg.data.from_model)
        if opted:
            raise UserError(f"{opted[0]}: this server runs no model's own code; its operator allows it with "
                            "`trainforge server --allow-remote-code`", public=True)
    if cfg.data.download:
        raise UserError("data.download: the job server downloads nothing; place the dataset under a data root "
                        "and point data.args.root at it")
    check_names(cfg)
    if cfg.log.mlflow is not None:
        check_tracking_uri(cfg.log.mlflow.tracking_uri, tracking_uri_allow)
    confined = [(field, str(confine(value, field, data_roots))) for field, value in submitted_paths(cfg)]
    confined += confine_pretrained(cfg, data_roots, allow_hub_downloads=allow_hub_downloads)
    if confined:  # the job reads the real paths that were checked, whatever a symlink says later
        raw = cfg.model_dump(mode="json")
        for field, real in confined:
            if not any(part.isdigit() for part in field.split(".")):  # one inside a list is checked again by the job
                set_dotted(raw, field.split("."), real, label=field)
        cfg = config_from_dict(raw)
    return cfg


def check_tracking_uri(uri: Optional[str], allowed: Sequence[str]) -> None:
    """A job logs only to a tracking server its operator allowed (`trainforge server --tracking-uri-allow URI`): the
    operator's tracking credentials go with the job there, and nowhere else."""
    field = "log.mlflow.tracking_uri"
    if urlparse(uri or "").scheme not in ("http", "https"):
        raise UserError(f"{field}: a job on the server logs to a tracking server (http:// or https://); a local store "
                        "(sqlite:, file:, or none set) would write outside the job's run directory")
    if not allowed:
        raise UserError(f"{field}: this server lets jobs log to no tracking server; its operator names the allowed "
                        f"ones with `trainforge server {ALLOW_FLAG} URI`")
    if not uri_allowed(str(uri), allowed):
        raise UserError(f"{field}: {quote(uri)} is not a tracking server this server allows ({', '.join(allowed)}); "
                        f"log to one of those, or ask its operator to add it with {ALLOW_FLAG}")


def submitted_paths(cfg: Config) -> list[tuple[str, str]]:
    """(field, value) of every file-system path a config makes the data sources read."""
    found = []
    if cfg.data.path:
        found.append(("data.path", cfg.data.path))
    if cfg.data.source == "torchvision":  # its root has a relative default: it must be named under a data root
        found.append(("data.args.root", str(cfg.data.args.get("root", "data_cache"))))
        found += named_paths(cfg.data.args.get("kwargs") or {}, "data.args.kwargs")
    return found


def admit(*, recipe: str, recipe_yaml: Optional[str], overrides: Sequence[str], num_gpus: int,
          slots: Sequence[Slot], data_roots: Sequence[Path] = (), allow_hub_downloads: bool = False) -> Admitted:
    """Validate, size and freeze a submission in this process; UserError when it is bad or can never fit."""
    cfg = load_submission(recipe, recipe_yaml, overrides, data_roots=data_roots,
                          allow_hub_downloads=allow_hub_downloads)
    return size_submission(cfg, num_gpus, slots)


def size_submission(cfg: Config, num_gpus: int, slots: Sequence[Slot]) -> Admitted:
    """Read the data the planner needs, resolve the job's setup, and refuse what can never fit. A data problem
    is a UserError whose `public` line names the field only."""
    capacity = {s.id: s.memory_bytes for s in slots}
    if num_gpus > len(slots):
        raise UserError(never_fits(capacity, 0, num_gpus))
    global_batch = cfg.train.global_batch_size
    if global_batch % num_gpus:
        raise UserError(f"--gpus: train.global_batch_size ({global_batch}) does not divide over {num_gpus} GPUs; "
                        "change one of them", public=True)
    try:  # the run's own pre-flight: shapes and sizes (nothing decoded), the model on the meta device, no weights
        pre = preflight(cfg, world_size=num_gpus, fit_stats=False, on_meta=True)
    except UserError as e:
        raise UserError(str(e), public=public_message(e)) from None
    # the weights alone, a lower bound of the simulated peak: a model too big for every slot is refused before the
    # simulation (seconds for a deep model) runs, and nothing the simulation would admit is refused here
    floor = weights_floor_bytes(pre.model, shards=num_gpus, frozen_stored=quantize_kind(cfg) == "none")
    reason = never_fits(capacity, int(floor), num_gpus, what="for its weights alone",
                        fix="use a smaller model")
    if reason:
        raise UserError(f"{cfg.name}: {reason}", public=True)
    try:
        setup = job_setup(cfg, num_gpus, slots[0].kind, max(capacity.values()), pre.facts)
    except UserError as e:
        raise UserError(str(e), public=public_message(e)) from None
    need = setup.predicted_peak_bytes
    if need is None:  # a step the planner cannot simulate (a detector's): the job reserves its slots whole
        need = max(capacity.values())
    reason = never_fits(capacity, need, num_gpus)
    if reason:
        raise UserError(f"{cfg.name}: {reason}", public=True)
    if cfg.train.micro_batch_size == "auto":  # pinned: the job never grows past what the scheduler reserves
        cfg = config_from_dict(apply_overrides(cfg.model_dump(mode="json"), [f"train.micro_batch_size={setup.micro_batch_size}"]))
    return Admitted(cfg.name, cfg.to_yaml(), need, setup.total_steps, setup.micro_batch_size)


def job_setup(cfg: Config, num_gpus: int, slot_kind: str, largest_slot_bytes: int, facts: DataFacts) -> RunSetup:
    """The setup the job will resolve on `num_gpus` slots of a kind, resolved here by the same function, with the
    largest slot as the budget of `auto` and the predicted peak per device (the reservation) always computed."""
    device = resolve_device("cpu" if slot_kind == "cpu" else "cuda", present=False)  # the slot's, not this process's
    budget = MemoryBudget(largest_slot_bytes, f"the largest {slot_kind} slot")
    # the slot's GPU model is not known here: bf16 is assumed, and fp16 costs the same memory
    return resolve(cfg, DistEnv(world_size=num_gpus), device, facts, budget=budget, bf16_supported=True, predict=True)
