"""Metric math and the run's metrics log.

    m = classification_metrics(y_true, y_pred, info.class_names)   # -> eval.json / val rows
    p = lm_metrics(mean_loss_nats)["perplexity"]

    log = MetricsLog(run.metrics, run.tensorboard)   # run = layout.RunDir(run_dir); None: no TensorBoard
    log.log({"split": "val", "step": step, "epoch": epoch, "loss": mean_loss, **m_scalars})
    log.close()
    rows = read_metrics(run.metrics)

Row names are a stable contract (docs/architecture.md, "Contracts"; tests, the dashboard, tune and calibration read them). Train rows: split, step, epoch, loss, lr,
samples_per_s, step_time_s, data_wait_frac, peak_mem_bytes, grad_norm. Val rows: split, step,
epoch, loss and the task's own metrics (`Task.metrics`: accuracy + macro_f1 for classification, perplexity for lm,
map for detection, miou for segmentation, and those of any task a plug-in registers). Which metric a setting may
name is the task's to say: `TASKS.get(task).check_metric(name, field)`.
"""
from __future__ import annotations

import json
import math
import resource
import time
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from trainforge.errors import UserError
from trainforge.files import write_text_atomic
from trainforge.hardware.device import peak_memory_bytes, synchronize
# json_safe and read_metrics live below training (report and console read the file too); re-exported
from trainforge.metrics_file import json_safe, read_metrics  # noqa: F401

# the metric math is the tasks' (trainforge.tasks); re-exported for the callers that score outside a run
from trainforge.tasks import TASKS, task_of  # noqa: E402,F401
from trainforge.tasks.classification import (classification_metrics, confusion_counts,  # noqa: E402,F401
                                             per_class_scores)
from trainforge.tasks.lm import lm_metrics  # noqa: E402,F401

# ---------------------------------------------------------------- the metrics log


class MetricsLog:
    """Appends one JSON object per line to run_dir/metrics.jsonl, flushing each line (a crash loses at most
    the line being written). Also mirrors scalars to TensorBoard (torch.utils.tensorboard.SummaryWriter in
    run_dir/tensorboard) when enabled, tag '<split>/<key>', global step = row['step'].

    Opening an existing file appends (a resumed run continues the same log); a partial last line left
    by a crash is cut off first so the next row starts on its own line.
    """

    def __init__(self, path: Path, tensorboard_dir: Optional[Path] = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_partial_last_line(self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        self._writer = None
        if tensorboard_dir is not None:
            # Imported here: tensorboard is slow to import and only needed when enabled.
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(tensorboard_dir), flush_secs=10)

    def log(self, row: dict) -> None:
        """Write one row; it needs "split" and "step". NaN/inf are written as null."""
        assert "split" in row and "step" in row, f"a metrics row needs 'split' and 'step': {row}"
        safe = json_safe(row)
        self._file.write(json.dumps(safe, allow_nan=False) + "\n")
        self._file.flush()
        if self._writer is not None:
            step = int(safe["step"])
            for key, value in safe.items():
                if key in ("split", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue  # TensorBoard takes numbers only; null (non-finite) values are skipped
                self._writer.add_scalar(f"{safe['split']}/{key}", value, global_step=step)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_partial_last_line(path: Path) -> None:
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)  # rfind = -1 (no complete line) truncates to empty


class NullLog:
    """What ranks other than 0 log to: nothing (one voice per run)."""

    def log(self, row: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class Window:
    """Train statistics between two log rows: mean loss, throughput, share of time waiting for data."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.steps, self.loss_sum, self.wait_s = 0, 0.0, 0.0

    def add(self, loss: float, wait_s: float) -> None:
        self.steps += 1
        self.loss_sum += loss
        self.wait_s += wait_s

    def row(self, device: torch.device, global_batch: int) -> dict[str, Any]:
        synchronize(device)
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        steps = max(self.steps, 1)  # a window of only skipped steps still reports its timing
        return {
            "loss": self.loss_sum / self.steps if self.steps else math.nan,
            "samples_per_s": self.steps * global_batch / elapsed,
            "step_time_s": elapsed / steps,
            "data_wait_frac": min(self.wait_s / elapsed, 1.0),
            "peak_mem_bytes": peak_bytes(device),
        }


def peak_bytes(device: torch.device) -> int:
    """Accelerator: peak allocated by tensors; CPU: the process's peak resident set size."""
    peak = peak_memory_bytes(device)
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def truncate_metrics(path: Path, after_step: int) -> None:
    """On resume, drop rows logged after the checkpoint (they will be logged again)."""
    if not path.exists():
        return
    rows = read_metrics(path)
    kept = [r for r in rows if r.get("step", 0) <= after_step]
    if len(kept) != len(rows) or after_step == 0:
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
