"""Command-line entry points of this stage; registered on the main `trainforge` app by cli.py.

Keep module-level imports light (typer, rich, trainforge.console): heavy libraries load inside commands.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from trainforge.config import load_config
from trainforge.console import out, print_json
from trainforge.errors import UserError
from trainforge.tuning.results import trials_table


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the `trainforge` app."""
    app.command("tune")(tune)


def tune(
    recipe: str = typer.Argument(..., help="Recipe YAML path or built-in name."),
    overrides: Optional[List[str]] = typer.Argument(None, help="KEY=VALUE overrides for every trial, e.g. train.epochs=3"),
    space: Path = typer.Option(..., "--space", help="Search space YAML: dotted config keys -> {type, low, high, log, step, choices}."),
    trials: int = typer.Option(..., "--trials", help="Total finished trials the study should hold (a rerun runs the remainder)."),
    parallel: int = typer.Option(1, "--parallel", help="Worker processes (one GPU each, or a share of the CPU cores)."),
    storage: Optional[str] = typer.Option(None, "--storage", help="SQLAlchemy URL (default sqlite:///<out>/study.db); "
                                          "PostgreSQL shares a study between machines."),
    study: Optional[str] = typer.Option(None, "--study", help="Study name (default: the recipe's name)."),
    pruner: str = typer.Option("median", "--pruner", help="median | hyperband | none"),
    metric: Optional[str] = typer.Option(None, "--metric", help="Validation metric (default accuracy, or loss for LMs)."),
    direction: Optional[str] = typer.Option(None, "--direction", help="maximize | minimize (default: the metric's)."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Study directory (default studies/<study>)."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
) -> None:
    """Hyperparameter search with Optuna: TPE sampling, pruning, parallel workers, a resumable study.

        trainforge tune recipes/digits_cnn.yaml --space recipes/sweeps/digits_cnn.yaml --trials 20 --parallel 2

    Writes <out>/best_config.yaml (train it with `trainforge train <out>/best_config.yaml`), trials.csv,
    report.html, and each trial's run directory under <out>/trials/.
    """
    overrides = list(overrides or [])
    if "=" in recipe:  # as for train: `trainforge tune optim.lr=1e-3 --space ...` means the default recipe
        recipe, overrides = None, [recipe, *overrides]
    load_config(recipe, overrides)  # a bad key, a wrong type, a missing recipe: answered before optuna and torch load
    if not space.is_file():
        raise UserError(f"--space: {space} does not exist; pass a search space YAML (recipes/sweeps/ has examples)")
    from trainforge.tuning.api import no_trial_completed  # heavy (optuna): the CLI starts fast without it
    from trainforge.tuning.api import tune as run_tune  # heavy (optuna): the CLI starts fast without it
    result = run_tune(recipe, space, trials=trials, overrides=overrides, parallel=parallel, storage=storage,
                      study=study, pruner=pruner, metric=metric, direction=direction, out=out_dir)
    if as_json:
        print_json({k: v for k, v in result.items() if k not in ("trials", "param_keys")})
    else:
        best = result["best_trial"]
        out.print(trials_table(result["trials"], result["param_keys"], result["metric"], best["number"] if best else None))
        c = result["counts"]
        out.print(f"{c['complete']} complete, {c['pruned']} pruned, {c['failed']} failed")
        if best is not None:
            out.print(f"best: trial {best['number']}, {result['metric']} {best['value']:.4f}")
            out.print(f"train it: trainforge train {result['paths']['best_config']}")
        out.print(f"report: {result['paths']['report']}")
    failed = no_trial_completed(result)
    if failed is not None:
        raise failed
