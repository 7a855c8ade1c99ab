"""The run report: one self-contained HTML file (plots embedded as base64 PNGs, no JavaScript).

    path = write_report(run_dir)                      # -> run_dir/report.html
    path = write_report(run_dir, extra_sections=[("Compression", "<table>...</table>")])

Reads run_dir/metrics.jsonl, eval.json, config.yaml and data_report.json; each is optional and a
missing or unreadable one becomes a note in its section, so a run that crashed early still gets a
report. Every piece of text from those files is HTML-escaped.
"""
from __future__ import annotations

import base64
import json
import warnings
from html import escape
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from trainforge.errors import UserError
from trainforge.files import write_text_atomic
from trainforge.report.plots import confusion_matrix_png, pr_curves_png, roc_curves_png, training_charts
from trainforge.metrics_file import read_metrics
from trainforge.layout import CONFIG, DATA_REPORT, EVAL, METRICS, REPORT, SAMPLES, VAL_IMAGES

REPORT_NAME = REPORT
_MAX_VALUE_CHARS = 300  # long lists in data_report.json (e.g. per-channel stats) are cut here

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1100px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.6rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2rem; }
nav a { margin-right: 1rem; }
table { border-collapse: collapse; margin: .5rem 0; }
th, td { border: 1px solid #ccc; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table table { margin: 0; }
figure { display: inline-block; margin: .5rem; } img, svg { max-width: 100%; height: auto; }
pre { background: #f7f7f7; padding: .8rem; overflow-x: auto; }
.note { color: #777; font-style: italic; }
"""


def write_report(run_dir: Path, extra_sections: Sequence[tuple[str, str]] = ()) -> Path:
    """Write run_dir/report.html and return its path.

    `extra_sections` are (title, html) pairs appended after the built-in sections; the title is
    escaped, the html is inserted as given (the caller escapes its own text).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: run directory not found; pass the folder a training run wrote")

    rows, rows_note = _read_rows(run_dir / METRICS)
    eval_json, eval_note = _read_json(run_dir / EVAL)
    data_report, data_note = _read_json(run_dir / DATA_REPORT)
    config_text, config_note = _read_text(run_dir / CONFIG)

    sections: list[tuple[str, str, str]] = [  # (anchor id, title, body html)
        ("eval", "Evaluation", _eval_section(eval_json, eval_note)),
        ("curves", "Training curves", _curves_section(rows, rows_note)),
    ]
    if eval_json is not None and "confusion_matrix" in eval_json:
        sections.append(("confusion", "Confusion matrix", _confusion_section(eval_json)))
    if (run_dir / VAL_IMAGES).is_file():
        sections.append(("val-images", "Validation images", _val_images_section(run_dir / VAL_IMAGES, rows)))
    if eval_json is not None and isinstance(eval_json.get("pr_curves"), Mapping):
        sections.append(("pr-curves", "Precision-recall curves", _pr_section(eval_json["pr_curves"])))
    if eval_json is not None and isinstance(eval_json.get("roc_curves"), Mapping) and eval_json["roc_curves"]:
        sections.append(("roc-curves", "ROC curves", _roc_section(eval_json["roc_curves"], eval_json.get("auroc"))))
    if eval_json is not None and isinstance(eval_json.get("per_class"), Mapping):
        sections.append(("per-class", "Per-class report", _per_class_table(eval_json["per_class"])))
    samples, _ = _read_rows(run_dir / SAMPLES_FILE)
    if samples:
        sections.append(("answers", "Generated answers", _answers_section(samples)))
    sections.append(("data", "Data", _data_section(data_report, data_note)))
    sections.append(("config", "Config", _config_section(config_text, config_note)))
    for i, (title, body) in enumerate(extra_sections):
        sections.append((f"extra-{i}", title, body))

    html_text = page(run_dir.name, sections)
    path = run_dir / REPORT_NAME
    write_text_atomic(path, html_text)  # a reader never sees half a report
    return path


# ---------------------------------------------------------------- reading the run directory


def _read_rows(path: Path) -> tuple[list[dict], Optional[str]]:
    if not path.is_file():
        return [], f"No {path.name} in this run."
    rows = read_metrics(path)
    return rows, None if rows else f"{path.name} has no rows yet."


def _read_json(path: Path) -> tuple[Optional[dict], Optional[str]]:
    if not path.is_file():
        return None, f"No {path.name} in this run."
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        warnings.warn(f"{path}: unreadable ({e}); its report section is left empty", stacklevel=3)
        return None, f"{path.name} could not be read: {e}"
    if not isinstance(data, dict):
        return None, f"{path.name} is not a JSON object."
    return data, None


def _read_text(path: Path) -> tuple[Optional[str], Optional[str]]:
    if not path.is_file():
        return None, f"No {path.name} in this run."
    try:
        return path.read_text(encoding="utf-8", errors="replace"), None
    except OSError as e:
        return None, f"{path.name} could not be read: {e.strerror}"


# ---------------------------------------------------------------- sections


def _eval_section(eval_json: Optional[dict], missing: Optional[str]) -> str:
    if eval_json is None:
        return note(missing or "No evaluation results.")
    scalars = {k: v for k, v in eval_json.items() if _is_scalar(v)}
    if not scalars:
        return note("eval.json has no scalar metrics.")
    return key_value_table(scalars)


def _curves_section(rows: list[dict], missing: Optional[str]) -> str:
    if missing is not None:
        return note(missing)
    charts = training_charts(rows)
    if not charts:
        return note("metrics.jsonl has no plottable values.")
    return "\n".join(figure(title, png) for title, png in charts)


def _confusion_section(eval_json: dict) -> str:
    try:
        counts = np.asarray(eval_json["confusion_matrix"], dtype=np.int64)
    except (TypeError, ValueError):
        return note("confusion_matrix in eval.json is not a matrix of counts.")
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] == 0:
        return note(f"confusion_matrix in eval.json has shape {counts.shape}; expected square.")
    n = counts.shape[0]
    names = eval_json.get("class_names")
    if not isinstance(names, list) or len(names) != n:
        names = [str(i) for i in range(n)]  # label by index rather than drop the plot
    return figure("Confusion matrix (rows: true class, columns: predicted class)",
                   confusion_matrix_png(counts, [str(x) for x in names]))


def _val_images_section(path: Path, rows: list[dict]) -> str:
    """The task's picture of the first validation images at the last evaluation (training/evaluate.py)."""
    try:
        png = path.read_bytes()
    except OSError as e:
        return note(f"{path.name} could not be read: {e.strerror}")
    if not png.startswith(b"\x89PNG"):
        return note(f"{path.name} is not a PNG.")
    steps = [r.get("step") for r in rows if r.get("split") == "val"]
    at = f" at step {steps[-1]}" if steps and _is_number(steps[-1]) else ""
    return figure(f"The first validation images{at}: true in green, predicted in red (masks: image, true, "
                  "predicted)", png)


def _pr_section(curves: Mapping[str, Any]) -> str:
    """eval.json's `pr_curves` ({"iou", "recall": [...], "precision": {class: [... or null]}}): one chart, a line
    per class."""
    recall, precision = curves.get("recall"), curves.get("precision")
    if not isinstance(recall, list) or not isinstance(precision, Mapping) or not all(
            isinstance(v, list) and len(v) == len(recall) for v in precision.values()):
        return note("pr_curves in eval.json is not a recall list with a precision list of the same length per class.")
    try:
        points = [float(r) for r in recall]
        lines = {str(k): [None if p is None else float(p) for p in v] for k, v in precision.items()}
    except (TypeError, ValueError):
        return note("pr_curves in eval.json holds values that are not numbers.")
    iou = curves.get("iou")
    title = f"Precision-recall per class, test split (IoU {iou})" if _is_number(iou) else "Precision-recall per class"
    return figure(title, pr_curves_png(points, lines, title))


def _roc_section(curves: Mapping[str, Any], auroc: Any) -> str:
    """eval.json's `roc_curves` ({class: {"fpr": [...], "tpr": [...]}}): one chart, a line per class."""
    lines = {}
    for name, curve in curves.items():
        fpr, tpr = (curve.get(k) if isinstance(curve, Mapping) else None for k in ("fpr", "tpr"))
        if not isinstance(fpr, list) or not isinstance(tpr, list) or len(fpr) != len(tpr):
            return note("roc_curves in eval.json is not an fpr and a tpr list of the same length per class.")
        if not all(_is_number(v) for v in (*fpr, *tpr)):
            return note("roc_curves in eval.json holds values that are not numbers.")
        lines[str(name)] = ([float(v) for v in fpr], [float(v) for v in tpr])
    title = f"ROC, test split (AUROC {float(auroc):.3f})" if _is_number(auroc) else "ROC, test split"
    return figure(title, roc_curves_png(lines, title))


def _per_class_table(per_class: Mapping[str, Any]) -> str:
    """A row per class, a column per statistic the classes report (precision, recall, f1, support; a detector's
    ap; a segmenter's iou and dice), in the order they first appear."""
    columns: list[str] = []
    for stats in per_class.values():
        for key in stats if isinstance(stats, Mapping) else ():
            if key not in columns:
                columns.append(str(key))
    head = "<tr><th>class</th>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    body = []
    for name, stats in per_class.items():
        stats = stats if isinstance(stats, Mapping) else {}
        cells = "".join(value_cell(stats.get(c)) for c in columns)
        body.append(f"<tr><th>{escape(str(name))}</th>{cells}</tr>")
    return f"<table>{head}{''.join(body)}</table>"


SAMPLES_FILE = SAMPLES  # a chat run's greedy answers to fixed validation prompts (training.generate)
ANSWER_CHARS = 600


def _answers_section(rows: list[dict]) -> str:
    """The first and the latest evaluation's answers side by side with the reference answers."""
    steps = sorted({r.get("step") for r in rows if isinstance(r.get("step"), int)})
    shown = [steps[0], steps[-1]] if len(steps) > 1 else steps
    head = "<tr><th>step</th><th>prompt</th><th>answer</th><th>reference</th></tr>"
    cells = lambda r, k: f"<td><pre>{escape(str(r.get(k, ''))[:ANSWER_CHARS])}</pre></td>"  # noqa: E731
    body = [f"<tr><td>{r['step']}</td>{cells(r, 'prompt')}{cells(r, 'answer')}{cells(r, 'reference')}</tr>"
            for step in shown for r in rows if r.get("step") == step]
    return (note(f"Greedy answers to the first validation conversations at evaluation steps {', '.join(map(str, shown))} "
                 f"(all {len(steps)} evaluations in {SAMPLES_FILE}).") + f"<table>{head}{''.join(body)}</table>")


def _data_section(data_report: Optional[dict], missing: Optional[str]) -> str:
    if data_report is None:
        return note(missing or "No data report.")
    # The data report's keys belong to the data stage (rows read/kept, drops by reason, split
    # sizes, normalization stats); render whatever it holds as nested key/value tables.
    return key_value_table(data_report)


def _config_section(config_text: Optional[str], missing: Optional[str]) -> str:
    if config_text is None:
        return note(missing or "No config.")
    return f"<pre>{escape(config_text)}</pre>"


# ---------------------------------------------------------------- html helpers


def page(run_name: str, sections: list[tuple[str, str, str]], kind: str = "report") -> str:
    """The whole document: "trainforge <kind>: <run_name>" as its title, a nav bar, one <section> per (anchor id,
    title, body html). `kind` is also its generator meta tag (`runs compare` knows its own pages by it)."""
    nav = "".join(f'<a href="#{sid}">{escape(title)}</a>' for sid, title, _ in sections)
    body = "\n".join(
        f'<section id="{sid}">\n<h2>{escape(title)}</h2>\n{html}\n</section>' for sid, title, html in sections
    )
    title = f"trainforge {escape(kind)}: {escape(run_name)}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"{generator_tag(kind)}\n<title>{title}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{title}</h1>\n<nav>{nav}</nav>\n{body}\n</body>\n</html>\n"
    )


def generator_tag(kind: str) -> str:
    return f'<meta name="generator" content="trainforge {escape(kind)}">'


def figure(title: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{escape(title)}" src="data:image/png;base64,{data}"></figure>'


def key_value_table(mapping: Mapping[str, Any]) -> str:
    rows = []
    for key, value in mapping.items():
        if isinstance(value, Mapping):
            cell = f"<td>{key_value_table(value) if value else ''}</td>"
        else:
            cell = value_cell(value)
        rows.append(f"<tr><th>{escape(str(key))}</th>{cell}</tr>")
    return f"<table>{''.join(rows)}</table>"


def value_cell(value: Any) -> str:
    if _is_scalar(value) and not isinstance(value, (str, bool)) and value is not None:
        return f'<td class="num">{escape(_format_number(value))}</td>'
    if isinstance(value, list):
        text = ", ".join(_format_number(v) if _is_number(v) else str(v) for v in value)
    elif value is None:
        text = "–"
    else:
        text = str(value)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[:_MAX_VALUE_CHARS] + " …"
    return f"<td>{escape(text)}</td>"


def _format_number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def note(text: str) -> str:
    return f'<p class="note">{escape(text)}</p>'
