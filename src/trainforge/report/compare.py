"""Several runs side by side on one self-contained HTML page: `trainforge runs compare RUN_DIR... --out compare.html`.

    comparison = compare_runs([Path("runs/a"), Path("runs/b")])   # UserError naming a directory that is not a run
    path = write_comparison(comparison, Path("compare.html"))      # refuses a file it did not write (force=True: any)
    comparison.to_json()                                           # `runs compare --json`; the dashboard's /api/compare

The page (`comparison_html`): the runs (each one's `runs list` row), their train loss and validation loss and
metric curves overlaid (one line per run per chart, the same color on every chart, inline SVG in which each line
is the group `<g id="curve-<chart>-<run index>">` and the legend names the runs), the config keys whose values
differ between the runs (config.yaml flattened to dotted keys such as `optim.lr`), and the test metrics
(eval.json) side by side. No script and nothing from the network, like report.html; every string read from a
run is HTML-escaped, inside the SVGs by matplotlib's XML writer.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from trainforge.errors import UserError
from trainforge.files import check_writable, write_text_atomic
from trainforge.metrics_file import Series, metric_series, thin
from trainforge.report.html import generator_tag, note, page, value_cell
from trainforge.report.plots import line_chart, svg_element
from trainforge.report.runs import MAX_COMPARED, RunSummary, format_duration, load_run, summarize
from trainforge.tasks import TASKS

KIND = "comparison"  # the page's title and generator tag: how a later `runs compare` knows its own file
CURVES = (  # (chart id, title, y label, split, metric key, log scale)
    ("train-loss", "Train loss", "loss", "train", "loss", False),
    ("val-loss", "Validation loss", "loss", "val", "loss", False),
    ("val-accuracy", "Validation accuracy", "accuracy", "val", "accuracy", False),
    ("val-macro_f1", "Validation macro-F1", "macro-F1", "val", "macro_f1", False),
    ("val-perplexity", "Validation perplexity", "perplexity", "val", "perplexity", True),
)


def task_curves() -> tuple[tuple[str, str, str, str, str, bool], ...]:
    """CURVES, then a chart of each metric a task charts over training (a detector's mAP, a segmenter's mIoU)."""
    extra = {m: (f"val-{m}", f"Validation {m}", m, "val", m, False)
             for name in TASKS.names() for m in TASKS.get(name).chart_metrics}
    return CURVES + tuple(extra.values())


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()  # the value of a config key in a run whose config.yaml lacks it
_HEAD_BYTES = 4096


@dataclass(frozen=True)
class Curve:
    id: str
    title: str
    ylabel: str
    logy: bool
    series: tuple[Series, ...]  # one per run, in the comparison's order; ([], []) where a run has no data


@dataclass(frozen=True)
class Comparison:
    runs: tuple[RunSummary, ...]
    labels: tuple[str, ...]  # unique: the legend's and the tables' name of each run
    curves: tuple[Curve, ...]  # only the charts some run has data for
    config_differences: dict[str, tuple]  # dotted key -> each run's value (ABSENT where it lacks the key)
    test_metrics: dict[str, tuple]  # eval.json number -> each run's value (None where it has none)

    def to_json(self, max_points: int = 0) -> dict[str, Any]:
        """The comparison as data; with `max_points`, the curves too (each series thinned to at most that)."""
        doc: dict[str, Any] = {
            "runs": [{"label": label, **run.to_json()} for label, run in zip(self.labels, self.runs)],
            "config_differences": {k: [None if v is ABSENT else v for v in values]
                                   for k, values in self.config_differences.items()},
            "test_metrics": {k: list(values) for k, values in self.test_metrics.items()},
        }
        if max_points:
            doc["curves"] = [{"id": c.id, "title": c.title, "ylabel": c.ylabel, "series": [
                {"run": label, "points": thin([list(p) for p in zip(*series)], max_points)}
                for label, series in zip(self.labels, c.series)]} for c in self.curves]
        return doc


def compare_runs(run_dirs: Sequence[Path], labels: Optional[Sequence[str]] = None) -> Comparison:
    """The comparison of 2 to MAX_COMPARED runs; `labels` name them (default: their directory names, made unique)."""
    run_dirs = [Path(d) for d in run_dirs]
    assert labels is None or len(labels) == len(run_dirs), "one label per run"
    if not 2 <= len(run_dirs) <= MAX_COMPARED:
        raise UserError(f"RUN_DIR: compare takes 2 to {MAX_COMPARED} run directories, got {len(run_dirs)}; "
                        "pass the runs to compare (`trainforge runs list` shows them)")
    seen: dict[str, Path] = {}
    for d in run_dirs:
        if os.path.realpath(d) in seen:
            raise UserError(f"RUN_DIR: {d} is the same run as {seen[os.path.realpath(d)]}; pass each run once")
        seen[os.path.realpath(d)] = d
    files = [load_run(d) for d in run_dirs]
    curves = []
    for cid, title, ylabel, split, key, logy in task_curves():
        series = tuple(metric_series(f.rows, split, key) for f in files)
        if any(steps for steps, _ in series):
            curves.append(Curve(cid, title, ylabel, logy, series))
    return Comparison(
        runs=tuple(summarize(f) for f in files),
        labels=tuple(labels) if labels is not None else unique_labels(run_dirs),
        curves=tuple(curves),
        config_differences=config_differences([f.config for f in files]),
        test_metrics=_test_metrics([f.eval or {} for f in files]),
    )


def unique_labels(run_dirs: Sequence[Path]) -> tuple[str, ...]:
    """Each directory's name; where names repeat (jobs' run/ folders), with the parent folders that tell them apart."""
    for depth in range(1, 4):
        labels = ["/".join(Path(os.path.abspath(d)).parts[-depth:]) for d in run_dirs]
        if len(set(labels)) == len(labels):
            return tuple(labels)
    return tuple(f"{label} ({i + 1})" for i, label in enumerate(labels))


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 0.001}} -> {"optim.lr": 0.001}; lists and empty mappings are values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_differences(configs: Sequence[Mapping[str, Any]]) -> dict[str, tuple]:
    """The dotted keys whose values are not the same in every config (a key one lacks differs), in config order."""
    flat = [flatten(c) for c in configs]
    keys = dict.fromkeys(k for f in flat for k in f)
    differing = {}
    for key in keys:
        values = tuple(f.get(key, ABSENT) for f in flat)
        if any(v is ABSENT for v in values) or any(v != values[0] for v in values[1:]):
            differing[key] = values
    return differing


def _test_metrics(evals: Sequence[Mapping[str, Any]]) -> dict[str, tuple]:
    keys = dict.fromkeys(k for e in evals for k, v in e.items() if _is_number(v))
    return {k: tuple(e.get(k) if _is_number(e.get(k)) else None for e in evals) for k in keys}


# ---------------------------------------------------------------- the page


def comparison_html(comparison: Comparison) -> str:
    c = comparison
    sections = [
        ("runs", "Runs", _runs_table(c)),
        ("curves", "Curves", _curves_section(c)),
        ("config", "Config differences", _config_table(c)),
        ("test", "Test metrics", _test_table(c)),
    ]
    return page(", ".join(c.labels), sections, kind=KIND)


def write_comparison(comparison: Comparison, out: Path, *, force: bool = False) -> Path:
    """Write the page to `out` (atomically) and return it; UserError (--out) when it cannot or must not."""
    out = Path(out)
    check_out(out, force)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, comparison_html(comparison))
    except OSError as e:
        raise UserError(f"--out: cannot write {out} ({e.strerror}); choose a writable path") from None
    return out


def check_out(out: Path, force: bool) -> None:
    """Before any work: `out` may be written (it or its folders can be created) and replaced (it is absent, a page
    `runs compare` wrote, or `force`)."""
    if out.is_dir():
        raise UserError(f"--out: {out} is a directory; name the .html file to write")
    if os.path.lexists(out) and not force and not _written_here(out):
        raise UserError(f"--out: {out} exists and is not a page `trainforge runs compare` wrote; choose another file, "
                        "or pass --force to replace it")
    check_writable(out.parent, "--out")


def _written_here(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    return generator_tag(KIND) in head


def _runs_table(c: Comparison) -> str:
    head = ["run", "status", "steps", "best validation", "test", "duration", "micro-batch", "device", "directory"]
    rows = []
    for label, r in zip(c.labels, c.runs):
        best = f"{r.metric} {r.best_val:.4g} at step {r.best_val_step}" if r.best_val is not None else None
        test = f"{r.metric} {r.test:.4g}" if r.test is not None else None
        rows.append((label, [r.status, r.steps, best, test, format_duration(r.duration_s) or None, r.micro_batch_size,
                             r.device_label, r.run_dir]))
    return _table("runs-table", head, rows)


def _curves_section(c: Comparison) -> str:
    if not c.curves:
        return note("None of these runs has metrics.jsonl rows to draw yet.")
    figures = []
    for curve in c.curves:
        drawn = [(i, label, s) for i, (label, s) in enumerate(zip(c.labels, curve.series)) if s[0]]
        fig = line_chart(curve.title, curve.ylabel, {label: s for _, label, s in drawn}, logy=curve.logy,
                         colors=[f"C{i}" for i, _, _ in drawn],  # a run's color by its place: the same on every chart
                         line_ids=[f"curve-{curve.id}-{i}" for i, _, _ in drawn])
        missing = [label for label, s in zip(c.labels, curve.series) if not s[0]]
        caption = f"<figcaption>{note('No data here: ' + ', '.join(missing))}</figcaption>" if missing else ""
        figures.append(f'<figure class="chart" id="chart-{curve.id}" data-runs="{len(drawn)}">'
                       f"{svg_element(fig)}{caption}</figure>")
    return "\n".join(figures)


def _config_table(c: Comparison) -> str:
    if not c.config_differences:
        return note("The runs' config.yaml files hold the same values.")
    rows = [(key, [config_value(v) for v in values]) for key, values in c.config_differences.items()]
    return note("Only the keys whose values differ; '(absent)': the run's config.yaml lacks the key.") + _table(
        "config-differences", ["key", *c.labels], rows)


def _test_table(c: Comparison) -> str:
    if not c.test_metrics:
        return note("None of these runs has test metrics (eval.json): it is written when a run completes.")
    return _table("test-metrics", ["metric", *c.labels], list(c.test_metrics.items()))


def _table(table_id: str, head: Sequence[str], rows: Sequence[tuple[str, Sequence[Any]]]) -> str:
    """A table with a header row and one row per (name, cells), cells by `value_cell` (numbers right-aligned, long
    text cut). Every string is escaped."""
    head_html = "".join(f"<th>{escape(str(h))}</th>" for h in head)
    body = []
    for name, cells in rows:
        tds = "".join(value_cell(v) for v in cells)
        body.append(f'<tr data-key="{escape(name)}"><th>{escape(name)}</th>{tds}</tr>')
    return f'<table id="{table_id}"><thead><tr>{head_html}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def config_value(value: Any) -> str:
    """Exactly as written (YAML's spelling of null and booleans), never rounded: 3e-4 and 3.0001e-4 differ."""
    if value is ABSENT:
        return "(absent)"
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
