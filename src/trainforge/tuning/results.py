"""What a study leaves in its directory: best_config.yaml, trials.csv, and the rows behind the tables.

    rows = trial_rows(study.get_trials(), keys)           # one dict per trial
    write_trials_csv(out / "trials.csv", rows, keys)
    text = best_config_text(out / "best_config.yaml", base_config, study.best_trial, study_name, metric)
"""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml
from rich.table import Table

from trainforge.config import config_from_dict
from trainforge.files import write_text_atomic
from trainforge.layout import REPORT  # noqa: F401  (the study's report, named as a run's)
from trainforge.tuning.space import apply_params

BEST_CONFIG = "best_config.yaml"
TRIALS_CSV = "trials.csv"


def param_keys(trials: Iterable[Any], space_keys: Sequence[str] = ()) -> list[str]:
    """Column order: the space's keys, then any other key earlier trials sampled (the space may have changed)."""
    keys = list(space_keys)
    extra = sorted({k for t in trials for k in t.params} - set(keys))
    return keys + extra


def trial_rows(trials: Iterable[Any], keys: Sequence[str]) -> list[dict[str, Any]]:
    """number, state, value, <param>..., duration_s, run_dir, fail_reason: one row per trial, by number."""
    rows = []
    for t in sorted(trials, key=lambda t: t.number):
        duration_s = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        rows.append({
            "number": t.number,
            "state": t.state.name,
            "value": t.value if t.values else None,
            **{k: t.params.get(k) for k in keys},
            "duration_s": None if duration_s is None else round(duration_s, 3),
            "run_dir": t.user_attrs.get("run_dir"),
            "fail_reason": t.user_attrs.get("fail_reason"),
        })
    return rows


def write_trials_csv(path: Path, rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> Path:
    columns = ["number", "state", "value", *keys, "duration_s", "run_dir"]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row[c] for c in columns})
    write_text_atomic(path, buf.getvalue())
    return path


def best_config_text(path: Path, base_config: dict[str, Any], best: Any, study_name: str, metric: str) -> str:
    """The complete recipe of the best trial: the tuned recipe + overrides + the best parameters."""
    cfg = config_from_dict(apply_params(base_config, dict(best.params)))
    lines = [
        f"# trainforge train {path}",
        f"# Best trial {best.number} of study {study_name}: {metric} {best.value:.6g}. Tuned parameters:",
        *[f"#   {k}: {_short(v)}" for k, v in best.params.items()],
    ]
    return "\n".join(lines) + "\n" + cfg.to_yaml()


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def format_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def trials_table(rows: Sequence[dict[str, Any]], keys: Sequence[str], metric: str, best_number: Any = None) -> Any:
    """A rich table of the trials (the best one marked with *)."""
    table = Table(title=f"trials ({metric}; * best)")
    for col in ("trial", "state", metric, *keys, "time s"):
        # fold, not "…": on a narrow terminal a parameter's value must still be readable in full
        table.add_column(col, justify="left" if col == "state" else "right", overflow="fold")
    for r in rows:
        mark = "*" if r["number"] == best_number else ""
        value = "-" if r["value"] is None else f"{r['value']:.4f}"
        duration = "-" if r["duration_s"] is None else f"{r['duration_s']:.1f}"
        table.add_row(f"{r['number']}{mark}", r["state"].lower(), value, *[format_value(r[k]) for k in keys], duration)
    return table
