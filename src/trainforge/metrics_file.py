"""The metrics.jsonl format, read and made strict-JSON safe: standard library only, below `training`.

    rows = read_metrics(RunDir(run_dir).metrics)   # the report, calibration, tests (layout.RunDir)
    steps, values = metric_series(rows, "val", "accuracy")   # one metric's curve (the report, runs list/compare)
    json.dumps(json_safe(doc), allow_nan=False)        # every JSON file a run writes; `--json` output

`engine.metrics.MetricsLog` writes the file; the report (`report.html`), the console and the planner's
calibration read it from here without importing the training package.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from trainforge.errors import UserError
from trainforge.files import read_regular

Series = tuple[list[float], list[float]]  # (steps, values), sorted by step


def json_safe(obj: Any) -> Any:
    """A copy that `json.dumps(..., allow_nan=False)` accepts: NaN/inf -> None, numpy/torch scalars -> Python.

    Use it for every JSON file a run writes (metrics.jsonl, eval.json): strict JSON has no NaN.
    """
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, (bool, str)) or obj is None:
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "tolist"):  # numpy scalars/arrays, 0-d or small torch tensors
        return json_safe(obj.tolist())
    return obj


def read_metrics(path: Path, max_bytes: Optional[int] = None) -> list[dict]:
    """All rows of a metrics.jsonl, in file order; with `max_bytes`, the rows of its last `max_bytes` only, read as
    a file someone else wrote (`files.read_regular`: no link followed, a FIFO or device refused with Unreadable).

    A truncated last line (crash mid-write) is ignored silently; a malformed line elsewhere is skipped
    with a warning, so a damaged log still yields its good rows.
    """
    path = Path(path)
    try:
        if max_bytes is None:
            text = path.read_text(encoding="utf-8", errors="replace")
        else:
            data, _, size = read_regular(path, max_bytes, tail=True)
            if len(data) < size:  # the first line read is the cut-off end of an older row
                data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
            text = data.decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise UserError(f"{path}: metrics file not found; point at a run directory's metrics.jsonl") from None
    lines = text.split("\n")
    rows: list[dict] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, a number beyond int's digit limit, nested without end
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif number < len(lines):  # a line with a newline after it was written in full: real damage
            warnings.warn(f"{path}:{number}: not a JSON object; line skipped", stacklevel=2)
    return rows


def metric_series(rows: Sequence[Mapping], split: str, key: str, scale: float = 1.0) -> Series:
    """(steps, values) of one metric of one split; missing and null (non-finite) values are left out.

    When a step occurs more than once (a resumed run re-logs the steps after its checkpoint), the
    row written last wins, so the curve shows what the surviving run did.
    """
    last_row_by_step: dict[float, Mapping] = {}
    for row in rows:
        if row.get("split") == split and _is_number(row.get("step")):
            last_row_by_step[row["step"]] = row
    steps: list[float] = []
    values: list[float] = []
    for step in sorted(last_row_by_step):
        value = last_row_by_step[step].get(key)
        if _is_number(value) and math.isfinite(value):
            steps.append(step)
            values.append(value * scale)
    return steps, values


def thin(items: list, limit: int) -> list:
    """At most `limit` of `items`, evenly spaced, the last one kept: a chart needs no more points than pixels."""
    if len(items) <= limit:
        return items
    stride = -(-len(items) // limit)
    return items[::stride] + ([items[-1]] if (len(items) - 1) % stride else [])


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
