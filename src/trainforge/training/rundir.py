"""Where a run lives: create `runs/<name>-<timestamp>/`, protect existing runs, find what to resume."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from trainforge.errors import UserError
from trainforge.files import check_writable  # noqa: F401  (training.api imports it from here)
from trainforge.engine.checkpoint import find_resume_checkpoint
from trainforge.layout import CHECKPOINTS, CONFIG, FINAL, MANIFEST, METRICS


def new_run_dir(runs_root: Path, name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = runs_root / f"{name}-{stamp}"
    n = 1
    while path.exists():  # two runs started in the same second
        n += 1
        path = runs_root / f"{name}-{stamp}-{n}"
    return path


def holds_a_run(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in (CONFIG, CHECKPOINTS, FINAL, METRICS))


def resolve_checkpoint_arg(path: Path) -> tuple[Path, Optional[Path]]:
    """For `--resume PATH`: (run dir, checkpoint) from a run dir or a `checkpoints/step-*` dir."""
    path = path.resolve()
    if (path / MANIFEST).is_file() and path.parent.name == CHECKPOINTS:
        return path.parent.parent, path
    if path.is_dir():
        return path, find_resume_checkpoint(path / CHECKPOINTS)
    raise UserError(f"--resume: {path} is neither a run directory nor a checkpoint directory")


def latest_run_dir(runs_root: Path, name: str) -> Optional[Path]:
    """Newest `runs_root/<name>-*` that has a checkpoint, for `--resume auto` without `--run-dir`."""
    if not runs_root.is_dir():
        return None
    runs = [p for p in runs_root.glob(f"{name}-*") if (p / CHECKPOINTS).is_dir()]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None
