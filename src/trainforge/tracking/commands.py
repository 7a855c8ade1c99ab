"""Command-line entry points of tracking (`trainforge runs ...`); registered on the main app by cli.py.

Keep module-level imports light (typer, rich, trainforge.console): MLflow loads inside the command.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.table import Table

from trainforge.config import MlflowConfig, migrate_keys
from trainforge.console import out, print_json
from trainforge.errors import UserError
from trainforge.report.commands import runs_group
from trainforge.layout import CONFIG

def register(app: typer.Typer) -> None:
    """Add `sync` to the app's `trainforge runs` group."""
    runs_group(app).command("sync")(sync)


def sync(
    run_dir: Path = typer.Argument(..., help="A run directory (holds config.yaml)."),
    tracking_uri: Optional[str] = typer.Option(None, "--tracking-uri", help="Default: the one the run logged to "
                                               "(<run>/mlflow.json), else its log.mlflow.tracking_uri, "
                                               "$MLFLOW_TRACKING_URI, or the embedded sqlite:///<runs_root>/mlflow.db."),
    experiment: Optional[str] = typer.Option(None, "--experiment", help="Default: log.mlflow.experiment, else the "
                                             "recipe's name."),
    register_model: Optional[str] = typer.Option(None, "--register-model", help="Register the final model."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
) -> None:
    """Upload a run to MLflow from its directory: what a live upload missed (server down, log.mlflow unset), once.

    Continues the run's MLflow run when it has one (<run>/mlflow.json), so nothing is uploaded twice."""
    from trainforge.tracking.mlflow_run import sync_run_dir  # MLflow is imported only there

    settings, runs_root, parent = _run_settings(run_dir)
    changes = {k: v for k, v in {"experiment": experiment, "register_model": register_model}.items() if v is not None}
    result = sync_run_dir(run_dir, settings.model_copy(update=changes), runs_root, tracking_uri, parent)
    if as_json:
        print_json(result)
        return
    table = Table(title=f"{run_dir} in MLflow", show_header=False)
    table.add_row("tracking URI", result["tracking_uri"])
    table.add_row("run id", f"{result['run_id']} (experiment {result['experiment_id']}), {result['status']}")
    table.add_row("metrics", f"up to step {result['metrics_step']}")
    table.add_row("artifacts", ", ".join(result["artifacts"]) or "none")
    if result["model_version"]:
        table.add_row("registered", f"version {result['model_version']}")
    out.print(table)


def _run_settings(run_dir: Path) -> tuple[MlflowConfig, Path, Optional[str]]:
    """The run's log.mlflow (defaults when it had none), log.runs_root and the tuning study's MLflow run it is a
    trial of (stage.mlflow_parent_run_id), from its config.yaml (keys that moved read at their new place)."""
    try:
        doc = yaml.safe_load((run_dir / CONFIG).read_text())
    except FileNotFoundError:
        raise UserError(f"RUN_DIR: {run_dir} is not a run directory (no config.yaml)") from None
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"RUN_DIR: {run_dir / CONFIG} is not readable ({e})") from None
    doc = migrate_keys(doc) if isinstance(doc, dict) else {}
    log = doc.get("log") or {}
    try:
        settings = MlflowConfig.model_validate(log.get("mlflow") or {})
    except ValueError:
        settings = MlflowConfig()
    parent = (doc.get("stage") or {}).get("mlflow_parent_run_id")
    return settings, Path(str(log.get("runs_root") or "runs")), parent if isinstance(parent, str) else None
