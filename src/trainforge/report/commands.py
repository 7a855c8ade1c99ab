"""`trainforge runs list` and `trainforge runs compare`: the runs under a folder, and several runs on one page.

    trainforge runs list                                  # the runs under ./runs (log.runs_root), oldest first
    trainforge runs list /shared/runs --json              # one JSON document: a list of runs list rows
    trainforge runs compare runs/a runs/b runs/c          # -> ./compare.html: curves, config differences, test metrics
    trainforge runs compare runs/a runs/b --out /tmp/ab.html --json
    trainforge runs report runs/a                         # (re)writes runs/a/report.html from the run directory

Module-level imports stay light: the comparison's charts load matplotlib only while `runs compare` draws them.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from trainforge.config import LogConfig
from trainforge.console import err, out, print_json
from trainforge.errors import UserError
from trainforge.layout import CONFIG
from trainforge.report.runs import RunSummary, find_runs, format_duration

if TYPE_CHECKING:
    from trainforge.report.compare import Comparison

DEFAULT_RUNS_ROOT = LogConfig.model_fields["runs_root"].default
STATUS_STYLE = {"completed": "green", "early_stopped": "green", "running": "blue", "stopped": "yellow",
                "failed": "red", "incomplete": "dim"}


def runs_group(app: typer.Typer) -> typer.Typer:
    """The app's `trainforge runs` group, made by whichever stage registers first (tracking's `runs sync` shares it)."""
    group = next((g.typer_instance for g in app.registered_groups if g.name == "runs"), None)
    if group is None:
        group = typer.Typer(no_args_is_help=True, help="The runs in a directory: list, compare, upload to MLflow.")
        app.add_typer(group, name="runs")
    return group


def register(app: typer.Typer) -> None:
    """Add `list` and `compare` to the app's `runs` group."""
    group = runs_group(app)
    group.command("list")(list_runs)
    group.command("compare")(compare)
    group.command("report")(report)


def report(
    run_dir: Path = typer.Argument(..., help="A run directory (the folder holding config.yaml and metrics.jsonl)."),
) -> None:
    """Write a run's report.html from its run directory.

    For a run trained with log.report: false, a run stopped before its end, or a report to redraw. Only that
    run's report.html is replaced."""
    from trainforge.report import write_report  # heavy (matplotlib): `runs list` starts fast

    if not (run_dir / CONFIG).is_file():
        raise UserError(f"{run_dir}: not a run directory (no {CONFIG}); pass the folder a training run wrote")
    out.print(str(write_report(run_dir)), highlight=False, soft_wrap=True)


def list_runs(
    directory: Path = typer.Argument(Path(DEFAULT_RUNS_ROOT), help="Folder holding run directories (searched two "
                                     "levels down, e.g. a tune study's trials/); default: runs."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document: a list of runs."),
) -> None:
    """List the runs under a folder, oldest start first.

    Columns: status, steps, best validation and test metric, duration, micro-batch, device. Statuses:
    completed, early_stopped, running (a guess from recent writes), stopped (resume with --resume auto), failed,
    incomplete (docs/tracking.md)."""
    runs, skipped = find_runs(directory)
    for path, why in skipped:
        err.print(f"skipped {escape(path)}: {escape(why)}", highlight=False, soft_wrap=True)
    if as_json:
        print_json([r.to_json() for r in runs])
        return
    if not runs:
        err.print(f"no runs under {escape(str(directory))} (a run is a folder holding config.yaml)", highlight=False)
        return
    out.print(runs_table(f"runs under {directory}", runs))


def compare(
    run_dirs: Optional[List[Path]] = typer.Argument(None, help="Two or more run directories.", show_default=False),
    out_file: Path = typer.Option(Path("compare.html"), "--out", help="The page to write; an existing file is "
                                  "replaced only if `runs compare` wrote it (or with --force)."),
    force: bool = typer.Option(False, "--force", help="Replace --out whatever it holds."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document (the page is written too)."),
) -> None:
    """Compare runs on one self-contained HTML page.

    The page: the runs' train loss and validation curves overlaid, the config keys whose values differ, the test
    metrics side by side."""
    from trainforge.report.compare import compare_runs, write_comparison  # heavy (matplotlib): `runs list` starts fast

    comparison = compare_runs(run_dirs or [])
    path = write_comparison(comparison, out_file, force=force)
    if as_json:
        print_json({"out": str(path), **comparison.to_json()})
        return
    out.print(runs_table("runs compared", comparison.runs, comparison.labels))
    out.print(_differences_table(comparison))
    err.print(f"wrote {escape(str(path))}", highlight=False)


def runs_table(title: str, runs: List[RunSummary], labels: Optional[tuple[str, ...]] = None) -> Table:
    """One row per run; the metric's name is in the header when every run is judged by the same one."""
    metrics = {r.metric for r in runs}
    common = metrics.pop() if len(metrics) == 1 else None
    table = Table(title=escape(title))
    table.add_column("run", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("steps", justify="right")
    table.add_column(escape(f"best val {common}" if common else "best val"), justify="right")
    table.add_column(escape(f"test {common}" if common else "test"), justify="right")
    for col in ("duration", "micro-batch", "device"):
        table.add_column(col, justify="right" if col == "micro-batch" else "left")
    for i, r in enumerate(runs):
        style = STATUS_STYLE.get(r.status, "")
        named = "" if common else f"{r.metric} "
        table.add_row(
            escape(labels[i] if labels else r.name), f"[{style}]{r.status}[/]" if style else r.status, str(r.steps),
            "" if r.best_val is None else escape(f"{named}{r.best_val:.4f} @{r.best_val_step}"),
            "" if r.test is None else escape(f"{named}{r.test:.4f}"),
            format_duration(r.duration_s), "" if r.micro_batch_size is None else str(r.micro_batch_size),
            escape(r.device_label or ""),
        )
    return table


def _differences_table(comparison: Comparison) -> Table:
    from trainforge.report.compare import config_value  # loaded already by `compare`, the only caller

    table = Table(title="config differences" if comparison.config_differences else "config differences: none")
    table.add_column("key")
    for label in comparison.labels:
        table.add_column(escape(label))
    for key, values in comparison.config_differences.items():
        table.add_row(escape(key), *(escape(config_value(v)) for v in values))
    return table
