"""`trainforge.train(...)`: pick the run directory, decide what to resume, and run the loop."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from trainforge.config import Config, apply_overrides, config_from_dict, load_config, read_yaml
from trainforge.errors import UserError
from trainforge.training.checkpoint import find_resume_checkpoint
from trainforge.training.loop import FitHooks, TrainResult, fit
from trainforge.training.rundir import (
    CHECKPOINTS,
    check_writable,
    holds_a_run,
    latest_run_dir,
    new_run_dir,
    resolve_checkpoint_arg,
)

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
        runs/<name>-* when run_dir is None); start fresh when there is none.
    resume=PATH: continue from that run directory or checkpoints/step-* directory.
    When resuming with config=None, the run's own config.yaml is used (plus overrides).
    hooks: see FitHooks (a replacement model or loss, a callback after each evaluation).
    """
    cfg, rd, ckpt = prepare_run(config, overrides, run_dir=run_dir, resume=resume)
    return fit(cfg, rd, resume_from=ckpt, hooks=hooks)


def prepare_run(
    config: ConfigLike,
    overrides: Optional[list[str]],
    *,
    run_dir: Optional[Union[str, Path]],
    resume: Optional[Union[str, Path]],
) -> tuple[Config, Path, Optional[Path]]:
    """(config, run directory, checkpoint to resume from or None), with every check that needs no work done."""
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
        cfg = _resumed_config(config, overrides, rd) if ckpt else _as_config(config, overrides)
    else:
        rd, ckpt = resolve_checkpoint_arg(Path(resume))
        if ckpt is None:
            raise UserError(f"--resume: {resume} holds no complete checkpoint; use --resume auto to start fresh")
        cfg = _resumed_config(config, overrides, rd)
    check_names(cfg)
    check_writable(rd)
    return cfg, rd, ckpt


def _as_config(config: ConfigLike, overrides: list[str]) -> Config:
    if isinstance(config, Config):
        if not overrides:
            return config
        return config_from_dict(apply_overrides(config.model_dump(mode="json"), overrides))
    return load_config(config, overrides)


def _resumed_config(config: ConfigLike, overrides: list[str], run_dir: Path) -> Config:
    if config is not None:
        return _as_config(config, overrides)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise UserError(f"{saved}: missing; pass the recipe to resume this run")
    return config_from_dict(apply_overrides(read_yaml(saved), overrides))


__all__ = ["train", "TrainResult", "FitHooks"]


def check_names(cfg: Config) -> None:
    """Registry names are checked before any work starts (each lookup error lists the valid names)."""
    from trainforge.data import SOURCES
    from trainforge.models import MODELS
    from trainforge.training.optim import OPTIMIZERS
    from trainforge.training.schedule import SCHEDULES

    SOURCES.get(cfg.data.source)
    MODELS.get(cfg.model.name)
    OPTIMIZERS.get(cfg.optim.name)
    SCHEDULES.get(cfg.schedule.name)
