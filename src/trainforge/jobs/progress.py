"""What a job's run directory says about it: progress, ETA, chart series, log text.

    progress(run_dir, total_steps)   # {"step", "total_steps", "fraction", "eta_s"} from the tail of metrics.jsonl
    series(run_dir)                  # {"train": [...], "val": [...]} rows for the dashboard's charts
    read_log(log, offset)            # (text, next offset) for `jobs logs --follow`

A run directory is written by the job, whose code may be hostile: every file of it is read through
`files.open_regular` (no link followed, a FIFO never blocks, a device or folder refused) and within a byte bound,
so one job can neither hang the server nor make it read without end. What cannot be read is shown as
"unreadable" with the reason. metrics.jsonl is read incrementally (`MetricsCurves`): a poll reads what is new.
"""
from __future__ import annotations

import json
import math
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Optional

from trainforge.files import open_regular, read_regular
from trainforge.metrics_file import thin
from trainforge.layout import METRICS, VAL_IMAGES
from trainforge.tasks import TASKS

TAIL_BYTES = 65536  # progress needs only the newest rows
MAX_POINTS = 600  # per series: a chart needs no more
STEP_TIME_WINDOW = 5  # train rows averaged for the ETA
BASE_CHART_KEYS = ("loss", "accuracy", "macro_f1", "perplexity", "lr")
READ_BUDGET_BYTES = 4 << 30  # of metrics.jsonl in one poll: a file growing without end is caught up later
READ_CHUNK_BYTES = 1 << 20  # read and parsed at a time, so a poll's memory is bounded by this, not the file
MAX_LINE_BYTES = 1 << 16  # a metrics row is a few hundred bytes; a longer line is skipped unparsed
MAX_CACHED_RUNS = 256  # runs whose curves are remembered between polls
PICTURE_MAX_BYTES = 16 << 20  # a run's validation picture the dashboard shows (a few hundred KiB in practice)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chart_keys() -> tuple[str, ...]:
    """The chartable metrics of every task registered now (map, miou ...): read from the registry when used, so a
    task a plug-in module registers after import is charted too."""
    return (*BASE_CHART_KEYS, *dict.fromkeys(m for name in TASKS.names() for m in TASKS.get(name).chart_metrics
                                             if m not in BASE_CHART_KEYS))


def chart_metrics() -> list[str]:
    """The validation metrics a job page charts beside the loss, in the order it prefers them: classification's and
    perplexity, then every registered task's own (read now: a plug-in task's too)."""
    return [k for k in chart_keys() if k not in ("loss", "lr")]


def read_picture(run_dir: Path) -> Optional[bytes]:
    """The run's validation picture (val_images.png), or None when there is none yet or it is not one. The run
    directory is written by the job: the file is opened without following a link, must be a regular file under
    PICTURE_MAX_BYTES and start as a PNG, so a job cannot make the server read anything else."""
    try:
        data, _, _ = read_regular(Path(run_dir) / VAL_IMAGES, PICTURE_MAX_BYTES + 1)
    except OSError:
        return None
    return data if data.startswith(PNG_SIGNATURE) and len(data) <= PICTURE_MAX_BYTES else None


def _rows(text: str) -> list[dict[str, Any]]:
    return _rows_of(text.encode().split(b"\n"))


def _rows_of(lines: list[bytes]) -> list[dict[str, Any]]:
    rows = []
    for line in lines:
        if not line.strip() or len(line) > MAX_LINE_BYTES:
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a partial line being written, the cut-off first line of a tail, or not JSON at all
        if isinstance(row, dict) and "step" in row and _is_number(row["step"]):
            rows.append(row)
    return rows


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (
        not isinstance(value, float) or math.isfinite(value))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def eta_s(step: int, total_steps: Optional[int], step_times_s: list[float]) -> Optional[float]:
    """Remaining steps x the recent mean step time; None when unknown."""
    if not total_steps or not step_times_s or step >= total_steps:
        return 0.0 if total_steps and step >= total_steps else None
    return (total_steps - step) * sum(step_times_s) / len(step_times_s)


def progress(run_dir: Path, total_steps: Optional[int]) -> dict[str, Any]:
    """Step, total and ETA from the last TAIL_BYTES of metrics.jsonl; with "unreadable" (the reason) when the job
    made the file something the server will not read (a FIFO, a link, a device)."""
    try:
        data, _, _ = read_regular(Path(run_dir) / METRICS, TAIL_BYTES, tail=True)
        text, unreadable = data.decode(errors="replace"), None
    except FileNotFoundError:
        text, unreadable = "", None
    except OSError as e:
        text, unreadable = "", str(e)
    rows = _rows(text)
    step = max((int(r["step"]) for r in rows if _is_int(r["step"])), default=0)
    times = [float(r["step_time_s"]) for r in rows if r.get("split") == "train" and _is_number(r.get("step_time_s"))]
    times = times[-STEP_TIME_WINDOW:]
    doc = {
        "step": step,
        "total_steps": total_steps,
        "fraction": min(step / total_steps, 1.0) if total_steps else None,
        "eta_s": eta_s(step, total_steps, times),
    }
    if unreadable:
        doc["unreadable"] = unreadable
    return doc


class _Thinned:
    """At most 2 x MAX_POINTS points of a series that only grows: every `stride`-th row is kept, and the stride
    doubles (every other kept point dropped) when the list is full, so memory and the chart stay bounded however
    long the run; the newest row is always shown. Rows are offered as raw lines and parsed only when kept: a poll
    of a long run's file parses a few hundred rows, not every one."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.stride, self.seen = 1, 0
        self.last: Optional[dict[str, Any]] = None
        self.last_line: Optional[bytes] = None

    def offer(self, line: bytes, row: Optional[dict[str, Any]] = None) -> None:
        if self.seen % self.stride == 0:
            point = _point(row if row is not None else _row(line))
            if point is None:
                return  # not a row: it takes no place in the series
            self.points.append(point)
            if len(self.points) > 2 * MAX_POINTS:
                self.points, self.stride = self.points[::2], self.stride * 2
            self.last, self.last_line = point, None
        else:
            self.last_line = line
        self.seen += 1

    def view(self) -> list[dict[str, Any]]:
        if self.last_line is not None:  # the newest row, not kept by the stride: parsed now, once
            self.last, self.last_line = _point(_row(self.last_line)), None
        shown = thin(self.points, MAX_POINTS)
        if self.last is not None and (not shown or shown[-1] is not self.last):
            shown = shown + [self.last]
        return shown


def _row(line: bytes) -> Optional[dict[str, Any]]:
    rows = _rows_of([line])
    return rows[0] if rows else None


def _point(row: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if row is None:
        return None
    return {"step": row["step"], **{k: row[k] for k in chart_keys() if _is_number(row.get(k))}}


class MetricsCurves:
    """The chart rows of one run's metrics.jsonl, read incrementally: the offset read so far is remembered (with the
    file's identity: a replaced or truncated file is read again from the start), so a poll costs what is new, and at
    most READ_BUDGET_BYTES a call (a huge file is caught up over several polls, never read in one)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.identity: Optional[tuple[int, int]] = None
        self._reset()

    def _reset(self) -> None:
        self.offset, self.partial, self.skipping = 0, b"", False
        self.splits = {"train": _Thinned(), "val": _Thinned()}

    def update(self, path: Path) -> None:
        """Read what was appended since the last call. Unreadable / FileNotFoundError as `files.open_regular`."""
        fd = open_regular(path)
        try:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if identity != self.identity or info.st_size < self.offset:
                self.identity = identity
                self._reset()
            os.lseek(fd, self.offset, os.SEEK_SET)
            budget = READ_BUDGET_BYTES
            while budget > 0:
                chunk = os.read(fd, min(budget, READ_CHUNK_BYTES))
                if not chunk:
                    break
                budget -= len(chunk)
                self.offset += len(chunk)
                self._take(chunk)
        finally:
            os.close(fd)

    def _take(self, chunk: bytes) -> None:
        lines = chunk.split(b"\n")
        first = self.partial + lines[0]
        lines[0] = b"" if self.skipping else first
        if len(lines) > 1:
            self.skipping = False
        self.partial = lines.pop()
        if len(self.partial) > MAX_LINE_BYTES:  # no metrics row is this long: drop it up to its newline
            self.partial, self.skipping = b"", True
        for line in lines:
            # trainforge writes `"split": "train"` on every train row: those are offered unparsed (most are not
            # kept); any other line is parsed and goes to the series its split names, whatever its spelling
            if b'"split": "train"' in line and b'"val"' not in line:
                self.splits["train"].offer(line)
                continue
            row = _row(line)
            split = self.splits.get(row.get("split")) if row is not None else None
            if split is not None:
                split.offer(line, row)

    def series(self) -> dict[str, list[dict[str, Any]]]:
        return {name: split.view() for name, split in self.splits.items()}


class _CurveCache:
    """One MetricsCurves a run directory, the MAX_CACHED_RUNS most recently polled kept."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.curves: OrderedDict[str, MetricsCurves] = OrderedDict()

    def get(self, run_dir: Path) -> MetricsCurves:
        key = str(run_dir)
        with self.lock:
            curves = self.curves.pop(key, None) or MetricsCurves()
            self.curves[key] = curves
            while len(self.curves) > MAX_CACHED_RUNS:
                self.curves.popitem(last=False)
            return curves


_CURVES = _CurveCache()


def series(run_dir: Path) -> dict[str, Any]:
    """Train and val rows (step + chartable numbers), at most MAX_POINTS (+ the newest) each, oldest first; with
    "unreadable" (the reason) when the job made metrics.jsonl something the server will not read."""
    curves = _CURVES.get(Path(run_dir))
    with curves.lock:
        try:
            curves.update(Path(run_dir) / METRICS)
        except FileNotFoundError:
            return {"train": [], "val": []}
        except OSError as e:
            return {"train": [], "val": [], "unreadable": str(e)}
        return curves.series()


def read_log(log: Path, offset: int = 0, max_bytes: int = 1 << 20) -> tuple[str, int]:
    """Up to `max_bytes` of the log from byte `offset`: (text, next offset). A negative offset reads the tail."""
    try:
        if offset < 0:
            data, nxt, _ = read_regular(log, min(-offset, max_bytes), tail=True)
        else:
            data, nxt, _ = read_regular(log, max_bytes, offset=offset)
    except OSError:
        return "", max(offset, 0)
    return data.decode(errors="replace"), nxt
