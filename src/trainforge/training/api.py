"""`trainforge.train(...)`: pick the run directory, decide what to resume, and run the loop."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

from trainforge.config import Config, apply_overrides, config_from_dict, config_from_yaml_text, load_config, read_yaml
from trainforge.console import err
from trainforge.engine.env import launched_worker
from trainforge.errors import UserError
from trainforge.engine.checkpoint import find_resume_checkpoint, load_state
from trainforge.training.loop import FitHooks, TrainResult
from trainforge.training.run import run
from trainforge.training.rundir import (
    check_writable,
    holds_a_run,
    latest_run_dir,
    new_run_dir,
    resolve_checkpoint_arg,
)
from trainforge.data import SOURCES
from trainforge.models import MODELS
from trainforge.engine.optim import OPTIMIZERS
from trainforge.engine.schedule import SCHEDULES
from trainforge.layout import CHECKPOINTS, CONFIG, CONFIG_TEXT, EVAL, FINAL, METRICS, REPORT, STATE, STEP_GLOB

ConfigLike = Union[Config, str, Path, None]


def train(
    config: ConfigLike = None,
    *,
    overrides: Optional[list[str]] = None,
    run_dir: Optional[Union[str, Path]] = None,
    resume: Optional[Union[str, Path]] = None,
    hooks: Optional[FitHooks] = None,
) -> TrainResult:
    """Train from a Config, a recipe path or name (None: the default recipe), optionally resuming.

    resume=None: a fresh run; refuses a run_dir that already holds a run (nothing is overwritten).
    resume="auto": continue from the newest complete checkpoint of run_dir (or of the newest
        runs/<name>-* when run_dir is None), with the run's own config.yaml when config is None; with no
        usable checkpoint the run's recipe starts from step 0 and the earlier attempt's files are moved
        to <run>/unusable-<time>/; an empty or new run_dir starts fresh.
    resume=PATH: continue from that run directory or checkpoints/step-* directory.
    When resuming with config=None, the run's own config.yaml is used (plus overrides).
    hooks: see FitHooks (a replacement model or loss, a callback after each evaluation).
    """
    cfg, rd, ckpt = prepare_run(config, overrides, run_dir=run_dir, resume=resume)
    return run(cfg, rd, resume_from=ckpt, hooks=hooks)


def prepare_run(
    config: ConfigLike,
    overrides: Optional[list[str]],
    *,
    run_dir: Optional[Union[str, Path]],
    resume: Optional[Union[str, Path]],
    start_over: bool = True,
) -> tuple[Config, Path, Optional[Path]]:
    """(config, run directory, checkpoint to resume from or None), with every check that needs no work done.

    start_over=False: --resume auto never moves an earlier attempt's files aside (a multi-node launcher:
    another node may be running the job in that directory right now, e.g. before its first checkpoint)."""
    overrides = list(overrides or [])
    ckpt: Optional[Path] = None
    if resume is None:
        cfg = _as_config(config, overrides)
        rd = Path(run_dir) if run_dir else new_run_dir(Path(cfg.log.runs_root), cfg.name)
        if holds_a_run(rd):
            raise UserError(f"--run-dir: {rd} already holds a run; pass --resume auto to continue it or choose a new directory")
    elif str(resume) == "auto":
        if run_dir:
            rd = Path(run_dir)
        else:
            probe = _as_config(config, overrides)
            rd = latest_run_dir(Path(probe.log.runs_root), probe.name) or new_run_dir(Path(probe.log.runs_root), probe.name)
        ckpt = find_resume_checkpoint(rd / CHECKPOINTS)
        cfg = _resumed_config(config, overrides, rd, ckpt)
        if ckpt is None and holds_a_run(rd) and start_over:
            _start_over(rd)
    else:
        rd, ckpt = resolve_checkpoint_arg(Path(resume))
        if ckpt is None:
            raise UserError(f"--resume: {resume} holds no complete checkpoint; use --resume auto to start fresh")
        cfg = _resumed_config(config, overrides, rd, ckpt)
    check_names(cfg)
    check_writable(rd)
    return cfg, rd, ckpt


def _as_config(config: ConfigLike, overrides: list[str]) -> Config:
    if isinstance(config, Config):
        if not overrides:
            return config
        return config_from_dict(apply_overrides(config.model_dump(mode="json"), overrides))
    return load_config(config, overrides)


def _resumed_config(config: ConfigLike, overrides: list[str], run_dir: Path, ckpt: Optional[Path]) -> Config:
    """The config a resumed run continues with: the run's own (config.yaml, else its checkpoint's), overrides
    on top. A recipe given as well must describe the same model: a run directory never changes model."""
    saved = _saved_config(run_dir, ckpt)
    if config is None:
        if saved is None:
            if holds_a_run(run_dir):
                raise UserError(f"--run-dir: {run_dir} has no config.yaml and no usable checkpoint to read the run's "
                                "recipe from; pass the recipe to restart it")
            return _as_config(None, overrides)  # nothing there yet: a fresh run of the default recipe
        cfg = _as_config(saved, overrides)
        if overrides:
            err.print(f"resuming {run_dir} with its own config.yaml and, on top: {' '.join(overrides)}",
                      highlight=False, soft_wrap=True, markup=False)
        return cfg
    cfg = _as_config(config, overrides)
    if saved is not None and saved.model != cfg.model:
        raise UserError(f"--run-dir: {run_dir} holds a run of another model (model.name {saved.model.name!r}, this "
                        f"recipe {cfg.model.name!r}, or other model.args); resume it without a recipe, or choose a new "
                        "--run-dir")
    return cfg


def _saved_config(run_dir: Path, ckpt: Optional[Path]) -> Optional[Config]:
    saved = run_dir / CONFIG
    if saved.is_file():
        return config_from_dict(read_yaml(saved))
    if ckpt is not None:
        return config_from_yaml_text(load_state(ckpt)[CONFIG_TEXT], str(ckpt / STATE))
    return None


STARTED_OVER = (CHECKPOINTS, METRICS, FINAL, EVAL, REPORT)


def _start_over(run_dir: Path) -> None:
    """--resume auto found no usable checkpoint in a run directory: the same recipe starts from step 0.
    Unusable checkpoints, or a final model, and the metrics that go with them are moved into
    <run>/unusable-<time>/ rather than overwritten. Torchrun workers leave this to their launcher."""
    if launched_worker():
        return
    if not any((run_dir / CHECKPOINTS).glob(STEP_GLOB)) and not (run_dir / FINAL).exists():
        err.print(f"--resume auto: {run_dir} has no checkpoint yet; starting its recipe from step 0",
                  highlight=False, soft_wrap=True, markup=False)
        return
    found = [name for name in STARTED_OVER if (run_dir / name).exists()]
    aside = new_run_dir(run_dir, "unusable")
    aside.mkdir()
    for name in found:
        os.replace(run_dir / name, aside / name)
    err.print(f"--resume auto: {run_dir} has no usable checkpoint; starting its recipe from step 0 "
              f"(moved {', '.join(found)} to {aside})", highlight=False, soft_wrap=True, markup=False)


__all__ = ["train", "TrainResult", "FitHooks"]


def check_names(cfg: Config) -> None:
    """Registry names are checked before any work starts (each lookup error lists the valid names)."""
    SOURCES.get(cfg.data.source)
    MODELS.get(cfg.model.name)
    OPTIMIZERS.get(cfg.optim.name)
    SCHEDULES.get(cfg.schedule.name)
