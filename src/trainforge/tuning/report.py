"""The study report: <out>/report.html with the trials, their history and what mattered.

    write_study_report(out / layout.REPORT, study, rows, keys, summary, best_config_text)

Plots (PNG, embedded as base64 like the run report): optimization history (every trial's value and
the best so far), the metric at each evaluation per trial (where pruned trials stopped), and the
parameter importances (optuna.importance, once >= 2 trials completed and the space has > 1 parameter).
"""
from __future__ import annotations

import io
import math
import warnings
from html import escape
from pathlib import Path
from typing import Any, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# the run report's page helpers: one look for every trainforge report
from trainforge.files import write_text_atomic
from trainforge.report.html import figure, key_value_table, note, page
from trainforge.tuning.results import format_value

_DPI = 100
_FIGSIZE_IN = (6.4, 3.6)
_LEGEND_UP_TO_TRIALS = 12  # beyond this a legend hides the lines


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, bbox_inches="tight")
    return buf.getvalue()


def _new_axes(title: str, xlabel: str, ylabel: str, figsize: tuple[float, float] = _FIGSIZE_IN) -> tuple[Figure, Any]:
    fig = Figure(figsize=figsize, dpi=_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def history_png(rows: Sequence[dict[str, Any]], metric: str, direction: str) -> Optional[bytes]:
    """Value of each complete (dot) and pruned (x, its last reported value) trial, and the best so far."""
    complete = [(r["number"], r["value"]) for r in rows if r["state"] == "COMPLETE" and _finite(r["value"])]
    pruned = [(r["number"], r["value"]) for r in rows if r["state"] == "PRUNED" and _finite(r["value"])]
    if not complete and not pruned:
        return None
    fig, ax = _new_axes("Optimization history", "trial", metric)
    if pruned:
        ax.scatter(*zip(*pruned), marker="x", color="#999999", label="pruned (last value)")
    if complete:
        ax.scatter(*zip(*complete), color="#1f77b4", label="complete", zorder=3)
        pick = max if direction == "maximize" else min
        best, xs, ys = None, [], []
        for number, value in complete:
            best = value if best is None else pick(best, value)
            xs.append(number)
            ys.append(best)
        ax.step(xs, ys, where="post", color="#d62728", label="best so far")
    ax.legend()
    return _png(fig)


def intermediate_png(trials: Sequence[Any], metric: str) -> Optional[bytes]:
    """The metric at each evaluation, one line per trial; pruned trials dashed (they stop early)."""
    curves = [(t, sorted(t.intermediate_values.items())) for t in trials if t.intermediate_values]
    if not curves:
        return None
    fig, ax = _new_axes(f"Validation {metric} per evaluation", "evaluation", metric)
    for t, points in curves:
        xs, ys = zip(*points)
        style = "--" if t.state.name == "PRUNED" else "-"
        ax.plot(xs, ys, style, marker="o", markersize=3, linewidth=1, alpha=0.8, label=f"trial {t.number}")
    ax.xaxis.get_major_locator().set_params(integer=True)
    if len(curves) <= _LEGEND_UP_TO_TRIALS:
        ax.legend(fontsize="small", ncol=2)
    return _png(fig)


def importances(study: Any, keys: Sequence[str]) -> tuple[dict[str, float], Optional[str]]:
    """({param: importance}, None), or ({}, why not)."""
    from optuna.trial import TrialState  # heavy (optuna): only importances() needs it

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2:
        return {}, f"Parameter importances need at least 2 complete trials; this study has {len(complete)}."
    if len(keys) < 2:
        return {}, "Parameter importances need a search space of more than one parameter."
    try:
        import optuna  # heavy (optuna): only importances() needs it

        with warnings.catch_warnings():  # e.g. "importances will be equal" for a handful of trials: shown as is
            warnings.simplefilter("ignore")
            return dict(optuna.importance.get_param_importances(study)), None
    except Exception as e:  # noqa: BLE001 - e.g. every trial sampled the same value: say so, keep the report
        return {}, f"Parameter importances could not be computed: {type(e).__name__}: {e}"


def importances_png(values: dict[str, float]) -> bytes:
    names = list(values)[::-1]  # most important on top
    fig, ax = _new_axes("Parameter importances", "importance", "", figsize=(6.4, 0.5 * len(names) + 1.5))
    ax.barh(names, [values[n] for n in names], color="#1f77b4")
    return _png(fig)


def _trials_html(rows: Sequence[dict[str, Any]], keys: Sequence[str], metric: str) -> str:
    cols = ["trial", "state", metric, *keys, "time s", "run dir / reason"]
    head = "<tr>" + "".join(f"<th>{escape(c)}</th>" for c in cols) + "</tr>"
    body = []
    for r in rows:
        cells = [str(r["number"]), r["state"].lower(), format_value(r["value"]), *[format_value(r[k]) for k in keys],
                 format_value(r["duration_s"]), r.get("fail_reason") or r.get("run_dir") or ""]
        body.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    return f"<table>{head}{''.join(body)}</table>"


def write_study_report(path: Path, study: Any, rows: Sequence[dict[str, Any]], keys: Sequence[str],
                       summary: dict[str, Any], best_config: Optional[str]) -> Path:
    metric, direction = summary["metric"], summary["direction"]
    sections: list[tuple[str, str, str]] = [("summary", "Summary", key_value_table(summary))]

    history = history_png(rows, metric, direction)
    sections.append(("history", "Optimization history",
                     figure("Optimization history", history) if history else note("No trial has a value yet.")))
    trials = study.get_trials(deepcopy=False)
    curves = intermediate_png(trials, metric)
    sections.append(("evaluations", "Evaluations",
                     figure("Metric per evaluation", curves) if curves else note("No trial reported an evaluation.")))
    values, why_not = importances(study, keys)
    if values:
        table = key_value_table({k: round(v, 4) for k, v in values.items()})
        sections.append(("importances", "Parameter importances", figure("Parameter importances", importances_png(values)) + table))
    else:
        sections.append(("importances", "Parameter importances", note(why_not or "")))
    sections.append(("trials", "Trials", _trials_html(rows, keys, metric)))
    sections.append(("best", "Best config",
                     f"<pre>{escape(best_config)}</pre>" if best_config else note("No trial completed yet.")))

    html_text = page(f"study {summary['study']}", sections)
    write_text_atomic(path, html_text)
    return path
