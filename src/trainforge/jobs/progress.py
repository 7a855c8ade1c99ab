"""What a job's run directory says about it: progress, ETA, chart series, log text.

    progress(run_dir, total_steps)   # {"step", "total_steps", "fraction", "eta_s"} from the tail of metrics.jsonl
    series(run_dir)                  # {"train": [...], "val": [...]} rows for the dashboard's charts
    read_log(log, offset)            # (text, next offset) for `jobs logs --follow`
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

from trainforge.metrics_file import thin
from trainforge.layout import METRICS, VAL_IMAGES
from trainforge.tasks import TASKS

TAIL_BYTES = 65536  # progress needs only the newest rows
MAX_POINTS = 600  # per series: a chart needs no more
STEP_TIME_WINDOW = 5  # train rows averaged for the ETA
CHART_KEYS = ("loss", "accuracy", "macro_f1", "perplexity", "lr",
              *dict.fromkeys(m for name in TASKS.names() for m in TASKS.get(name).chart_metrics))  # map, miou ...
PICTURE_MAX_BYTES = 16 << 20  # a run's validation picture the dashboard shows (a few hundred KiB in practice)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_picture(run_dir: Path) -> Optional[bytes]:
    """The run's validation picture (val_images.png), or None when there is none yet or it is not one. The run
    directory is written by the job: the file is opened without following a link, must be a regular file under
    PICTURE_MAX_BYTES and start as a PNG, so a job cannot make the server read anything else."""
    try:
        fd = os.open(Path(run_dir) / VAL_IMAGES, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > PICTURE_MAX_BYTES:
            return None
        data = f.read(PICTURE_MAX_BYTES + 1)
    return data if data.startswith(PNG_SIGNATURE) and len(data) <= PICTURE_MAX_BYTES else None


def _rows(text: str) -> list[dict[str, Any]]:
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a partial line being written, or the cut-off first line of a tail
        if isinstance(row, dict) and "step" in row:
            rows.append(row)
    return rows


def _tail(path: Path, max_bytes: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def eta_s(step: int, total_steps: Optional[int], step_times_s: list[float]) -> Optional[float]:
    """Remaining steps x the recent mean step time; None when unknown."""
    if not total_steps or not step_times_s or step >= total_steps:
        return 0.0 if total_steps and step >= total_steps else None
    return (total_steps - step) * sum(step_times_s) / len(step_times_s)


def progress(run_dir: Path, total_steps: Optional[int]) -> dict[str, Any]:
    rows = _rows(_tail(Path(run_dir) / METRICS, TAIL_BYTES))
    step = max((int(r["step"]) for r in rows), default=0)
    times = [float(r["step_time_s"]) for r in rows if r.get("split") == "train" and isinstance(r.get("step_time_s"), (int, float))]
    times = times[-STEP_TIME_WINDOW:]
    return {
        "step": step,
        "total_steps": total_steps,
        "fraction": min(step / total_steps, 1.0) if total_steps else None,
        "eta_s": eta_s(step, total_steps, times),
    }


def series(run_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Train and val rows (step + chartable numbers), at most MAX_POINTS each, oldest first."""
    try:
        text = (Path(run_dir) / METRICS).read_text(errors="replace")
    except OSError:
        text = ""
    out: dict[str, list[dict[str, Any]]] = {"train": [], "val": []}
    for row in _rows(text):
        split = row.get("split")
        if split in out:
            out[split].append({"step": row["step"], **{k: row[k] for k in CHART_KEYS if isinstance(row.get(k), (int, float))}})
    return {k: thin(v, MAX_POINTS) for k, v in out.items()}


def read_log(log: Path, offset: int = 0, max_bytes: int = 1 << 20) -> tuple[str, int]:
    """Up to `max_bytes` of the log from byte `offset`: (text, next offset). A negative offset reads the tail."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            f.seek(start)
            data = f.read(max_bytes)
    except OSError:
        return "", max(offset, 0)
    return data.decode(errors="replace"), start + len(data)


def read_text(path: Path) -> Optional[str]:
    try:
        return Path(path).read_text()
    except OSError:
        return None
