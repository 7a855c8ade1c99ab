"""The runs under a folder and what each one's files say: `trainforge runs list` (and `runs compare`, the dashboard).

    runs, skipped = find_runs(Path("runs"))      # [RunSummary], oldest start first; [(path, why)] for unreadable ones
    summary = read_run(Path("runs/digits_cnn-20250101-120000"))   # UserError when it is not a readable run
    summary.to_json()                            # one object of `runs list --json` (keys: RunSummary's fields)

A run is a directory holding config.yaml (trainforge writes it as a run starts). `find_runs` looks at the folder
itself, its subfolders and theirs (a tune study's trials/trial-NNNN), never through a symbolic link and never
inside a run; a file read is a regular file, not a link. The standard library, the config reader and the metrics
file reader only: listing runs loads neither torch nor matplotlib (and this package does not import `training`,
so the run directory's file names are spelled here).

Nothing in a run directory records the run's status; it is read from the files the run wrote:
  completed      final/model.json and eval.json: the run finished and its final model was tested
  early_stopped  completed, and its last train.early_stopping.patience evaluations did not improve on the one
                 whose weights were kept (final/model.json's step): the rule that stops a run
  failed         no final model, and the job server recorded a non-zero exit of the run's last attempt
                 (exit.json beside a job's run/ directory); a plain `trainforge train` leaves no such record
  running        no final model, no exit recorded, and config.yaml, metrics.jsonl or checkpoints/latest was
                 written within RUNNING_MIN_S seconds or RUNNING_INTERVALS of the run's own logging intervals,
                 whichever is longer: a guess, since nothing marks a live run (one killed a moment ago looks alike)
  stopped        a complete checkpoint (checkpoints/latest) and no final model: stopped by Ctrl-C or SIGTERM,
                 pruned by a tuner, or crashed or killed after that checkpoint; `--resume auto` continues it
  incomplete     none of these: it ended (or is still starting) before its first checkpoint
"""
from __future__ import annotations

import json
import os
import re
import stat
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

from trainforge.config import read_yaml
from trainforge.errors import UserError
from trainforge.files import read_regular
from trainforge.metrics_file import metric_series, read_metrics
from trainforge.layout import CHECKPOINTS, CONFIG, EVAL, FINAL, LATEST, META, METRICS, TENSORBOARD, JobDir
from trainforge.tasks import TASKS

FINAL_META = Path(FINAL) / META  # training.artifacts: the final model's facts, `ran` among them
LATEST_FILE = Path(CHECKPOINTS) / LATEST  # engine.checkpoint: names the newest complete checkpoint, written last
SEARCH_DEPTH = 2  # the folder, its subfolders and theirs
MAX_COMPARED = 10  # runs one comparison takes (`runs compare`, the dashboard): one color each
RUNNING_MIN_S = 120.0
RUNNING_INTERVALS = 10
MAX_JSON_BYTES = 64 << 20  # final/model.json holds the tokenizer of an LM: megabytes, not gigabytes
MAX_METRICS_BYTES = 32 << 20  # of metrics.jsonl read, its newest rows (~150k; a longer run's older rows are left out)
STATUSES = ("completed", "early_stopped", "failed", "running", "stopped", "incomplete")
_TENSORBOARD_STAMP = re.compile(r"events\.out\.tfevents\.(\d+)\.")  # SummaryWriter's file name: its creation time


@dataclass(frozen=True)
class RunSummary:
    """One row of `runs list`; `to_json()` is its `--json` object (these keys, in this order)."""

    name: str  # the run directory's name
    run_dir: str
    recipe: Optional[str]  # config.yaml's `name`
    status: str  # one of STATUSES
    steps: int  # optimizer steps done
    metric: Optional[str]  # the validation metric the run is judged by (`judged_metric`)
    best_val: Optional[float]  # its best value on the validation split ...
    best_val_step: Optional[int]  # ... at this step
    test: Optional[float]  # the same metric on the test split (eval.json)
    started_at: Optional[float]  # unix time
    duration_s: Optional[float]  # from the start to the test metrics (completed) or to the latest write
    micro_batch_size: Optional[int]
    device: Optional[str]
    world_size: Optional[int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def device_label(self) -> Optional[str]:
        """The device, and the number of processes when more than one: "cuda:0 x8", "cpu"."""
        return f"{self.device} x{self.world_size}" if self.device and (self.world_size or 1) > 1 else self.device


@dataclass(frozen=True)
class RunFiles:
    """What a run directory holds, read once (`runs compare` draws curves from the same rows)."""

    run_dir: Path
    config: dict[str, Any]
    rows: list[dict] = field(default_factory=list)  # metrics.jsonl
    final: dict[str, Any] = field(default_factory=dict)  # final/model.json; {} without a final model
    eval: Optional[dict[str, Any]] = None  # eval.json


def find_runs(root: Path) -> tuple[list[RunSummary], list[tuple[str, str]]]:
    """(the runs under `root`, oldest start first; (path, why) of each run directory that could not be read)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"DIR: {root} is not a directory; pass the folder that holds your runs (default: runs)")
    runs: list[RunSummary] = []
    skipped: list[tuple[str, str]] = []
    now = time.time()

    def visit(directory: Path, depth: int) -> None:
        if os.path.lexists(directory / CONFIG):
            try:
                runs.append(summarize(load_run(directory), now=now))
            except UserError as e:
                skipped.append((str(directory), str(e)))
            return
        if depth == SEARCH_DEPTH:
            return
        try:
            with os.scandir(directory) as entries:
                children = sorted(e.name for e in entries
                                  if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
        except OSError as e:
            if depth == 0:
                raise UserError(f"DIR: cannot list {root} ({e.strerror}); pass a folder you can read") from None
            skipped.append((str(directory), f"cannot list it ({e.strerror})"))
            return
        for name in children:
            visit(directory / name, depth + 1)

    visit(root, 0)
    runs.sort(key=lambda r: (r.started_at is None, r.started_at or 0.0, r.run_dir))
    return runs, skipped


def read_run(run_dir: Path) -> RunSummary:
    return summarize(load_run(run_dir))


def load_run(run_dir: Path) -> RunFiles:
    """The files of one run; UserError (one line naming the directory) when it is not a readable run."""
    run_dir = Path(run_dir)
    if _regular(run_dir / CONFIG) is None:
        raise UserError(f"{run_dir}: not a run directory (no {CONFIG} file in it); pass a directory a training run "
                        "wrote")
    config = read_yaml(run_dir / CONFIG, follow_links=False)  # UserError naming the file: unreadable, not YAML
    rows: list[dict] = []
    if _regular(run_dir / METRICS) is not None:
        with warnings.catch_warnings():  # a damaged line is skipped; a listing shows the rows that are good
            warnings.simplefilter("ignore")
            try:
                rows = read_metrics(run_dir / METRICS, max_bytes=MAX_METRICS_BYTES)
            except OSError:
                rows = []
    return RunFiles(run_dir, config, rows, _read_json(run_dir / FINAL_META) or {}, _read_json(run_dir / EVAL))


def summarize(files: RunFiles, now: Optional[float] = None) -> RunSummary:
    run_dir, rows = files.run_dir, files.rows
    train_cfg = _mapping(files.config.get("train"))
    ran = _mapping(files.final.get("ran"))
    task = _mapping(files.final.get("data_info")).get("task") or _mapping(files.config.get("data")).get("task")
    metric, mode = judged_metric(train_cfg, rows, task)
    val_steps, values = metric_series(rows, "val", metric)
    best = None
    if values:
        best = (max if mode == "max" else min)(range(len(values)), key=lambda i: values[i])  # first of equals
    steps = max([int(r["step"]) for r in rows if _is_int(r.get("step"))] + [_int(ran.get("steps_trained")) or 0])
    started, last_write = _started_at(run_dir), _last_write(run_dir)
    status = _status(files, train_cfg, val_steps, last_write, time.time() if now is None else now)
    ended = _mtime(run_dir / EVAL) if status in ("completed", "early_stopped") else last_write
    micro = _int(ran.get("micro_batch_size"))
    if micro is None:
        micro = next((_int(r.get("micro_batch_size")) for r in reversed(rows) if r.get("split") == "train"), None)
    device = ran.get("device") if isinstance(ran.get("device"), str) else None
    if device is None and train_cfg.get("device") not in (None, "auto") and isinstance(train_cfg.get("device"), str):
        device = train_cfg["device"]  # asked for: what ran is recorded only with the final model
    test = files.eval.get(metric) if files.eval is not None else None
    return RunSummary(
        name=run_dir.name, run_dir=str(run_dir), recipe=_str(files.config.get("name")), status=status, steps=steps,
        metric=metric, best_val=values[best] if best is not None else None,
        best_val_step=int(val_steps[best]) if best is not None else None, test=_float(test),
        started_at=started, duration_s=max(0.0, ended - started) if started is not None and ended is not None else None,
        micro_batch_size=micro if micro is not None else _int(train_cfg.get("micro_batch_size")),
        device=device, world_size=_int(ran.get("world_size")),
    )


def judged_metric(train_cfg: Mapping[str, Any], rows: list[dict], task_name: Any = None) -> tuple[str, str]:
    """(metric, "max" | "min"): train.early_stopping's when the run has it (what its training optimized for), else
    the run's task's default metric (`trainforge tasks`) and its direction; for a run whose task is not known here,
    accuracy when its rows have it, else loss."""
    task = TASKS.get(task_name) if isinstance(task_name, str) and task_name in TASKS else None
    early = _mapping(train_cfg.get("early_stopping"))
    metric = early.get("metric") if isinstance(early.get("metric"), str) else None
    if early and task is not None:
        metric = metric or task.default_metric
        return metric, early.get("mode") if early.get("mode") in ("min", "max") else task.direction(metric)
    if metric is not None:
        return metric, "max" if early.get("mode") == "max" else "min"
    if task is not None:
        return task.default_metric, task.direction(task.default_metric)
    if any(r.get("split") == "val" and "accuracy" in r for r in rows):
        return "accuracy", "max"
    return "loss", "min"


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return ""
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# ---------------------------------------------------------------- status and times


def _status(files: RunFiles, train_cfg: Mapping[str, Any], val_steps: list[float], last_write: Optional[float],
            now: float) -> str:
    run_dir = files.run_dir
    if files.final and files.eval is not None:
        return "early_stopped" if _stopped_early(files.final, train_cfg, val_steps) else "completed"
    exit_code = _job_exit_code(run_dir)
    if exit_code not in (None, 0):
        return "failed"
    if exit_code is None and last_write is not None and now - last_write < _running_window_s(files.rows):
        return "running"
    if _regular(run_dir / LATEST_FILE) is not None:
        return "stopped"
    return "incomplete"


def _stopped_early(final: Mapping[str, Any], train_cfg: Mapping[str, Any], val_steps: list[float]) -> bool:
    """The stopping rule, read back: `patience` evaluations after the kept (best) one, none of them better."""
    patience, kept_step = _int(_mapping(train_cfg.get("early_stopping")).get("patience")), _int(final.get("step"))
    if patience is None or kept_step is None:
        return False
    return sum(1 for step in val_steps if step > kept_step) >= patience


def _job_exit_code(run_dir: Path) -> Optional[int]:
    """The exit code the job server's wrapper recorded for a job's run/ directory; None for any other run."""
    job = JobDir(run_dir.parent)
    if run_dir != job.run or _regular(job.recipe) is None:
        return None
    code = _mapping(_read_json(job.exit)).get("returncode")
    return code if _is_int(code) else None


def _running_window_s(rows: list[dict]) -> float:
    """How long a live run may go without writing: RUNNING_INTERVALS of its latest interval between train rows."""
    train = [r for r in rows if r.get("split") == "train" and _is_int(r.get("step"))]
    interval_s = 0.0
    if len(train) >= 2 and isinstance(train[-1].get("step_time_s"), (int, float)):
        interval_s = max(0, train[-1]["step"] - train[-2]["step"]) * float(train[-1]["step_time_s"])
    return max(RUNNING_MIN_S, RUNNING_INTERVALS * interval_s)


def _started_at(run_dir: Path) -> Optional[float]:
    """The oldest TensorBoard event file's creation time, else config.yaml's (which a resumed run rewrites)."""
    times = [t for t in [_mtime(run_dir / CONFIG)] if t is not None]
    try:
        with os.scandir(run_dir / TENSORBOARD) as entries:
            times += [float(m.group(1)) for e in entries if (m := _TENSORBOARD_STAMP.match(e.name))]
    except OSError:
        pass
    return min(times) if times else None


def _last_write(run_dir: Path) -> Optional[float]:
    times = [_mtime(run_dir / name) for name in (CONFIG, METRICS, LATEST_FILE, EVAL)]
    return max((t for t in times if t is not None), default=None)


# ---------------------------------------------------------------- reading files that may be anything


def _regular(path: Path) -> Optional[os.stat_result]:
    """The file's stat when it is a regular file (not a link, a folder or a FIFO), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _mtime(path: Path) -> Optional[float]:
    st = _regular(path)
    return st.st_mtime if st is not None else None


def _read_json(path: Path) -> Optional[dict]:
    try:
        raw, _, size = read_regular(path, MAX_JSON_BYTES + 1)
        data = json.loads(raw) if size <= MAX_JSON_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any) -> Optional[int]:
    return value if _is_int(value) else None


def _float(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None
