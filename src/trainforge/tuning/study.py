"""The Optuna study: storage, sampler, pruners, and which trials count as finished.

    storage = open_storage(url)                        # RDBStorage with heartbeats; SQLite or any SQLAlchemy URL
    study = open_study(storage, "digits_cnn", "maximize", "accuracy", base_config)   # create or continue
    fail_dead_trials(study, storage)                   # trials left RUNNING by a killed process -> FAIL
    wanted - count_finished(study.get_trials())        # trials still to run

A trial counts as finished when it COMPLETEd, was PRUNED, or FAILed by crashing (an exception in
training, or its worker process died). A trial that FAILed because the whole tune run was stopped
(killed, Ctrl-C) does not count: rerunning the same command runs it again with new parameters.
"""
from __future__ import annotations

import json
import os
import socket
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from trainforge.errors import UserError
from trainforge.registry import Registry

HEARTBEAT_INTERVAL_S = 10  # a running trial's process writes a heartbeat this often
HEARTBEAT_GRACE_S = 60  # ... and is declared dead (FAIL) after this long without one
SQLITE_TIMEOUT_S = 60  # workers share one SQLite file: wait for its lock instead of failing

DIRECTIONS = ("maximize", "minimize")
OPTUNA_DIRECTION = {"max": "maximize", "min": "minimize"}  # a task's metric direction, as optuna spells it

# fail_reason user attribute of a FAILed trial: a crash counts as finished, an interruption does not
CRASHED = ("error:", "worker died:")
INTERRUPTED = "interrupted:"

PRUNERS: Registry[Callable[[], Any]] = Registry("pruner", "--pruner")


@PRUNERS.register("median")
def _median() -> Any:
    import optuna  # heavy (optuna): loaded on first use

    # the first 3 trials run to the end to set the bar; no trial is judged on its first evaluation alone
    # (steps are evaluation counts: 1, 2, 3, ...)
    return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=2)


@PRUNERS.register("hyperband")
def _hyperband() -> Any:
    import optuna  # heavy (optuna): loaded on first use

    # resources are evaluation counts; the most a trial gets is learned from the first finished trial
    return optuna.pruners.HyperbandPruner(min_resource=1, max_resource="auto", reduction_factor=3)


@PRUNERS.register("none")
def _no_pruning() -> Any:
    import optuna  # heavy (optuna): loaded on first use

    return optuna.pruners.NopPruner()


def make_sampler(seed: int) -> Any:
    import optuna  # heavy (optuna): loaded on first use

    return optuna.samplers.TPESampler(seed=seed)


def sampler_seed(recipe_seed: int, existing_trials: int, worker_index: int) -> int:
    """Each worker its own seeded stream, and a continued study new ones (not a replay of its first trials)."""
    import numpy as np  # numpy: loaded on first use

    return int(np.random.SeedSequence([recipe_seed % 2**32, existing_trials, worker_index]).generate_state(1)[0])


# ---------------------------------------------------------------- storage


def default_storage_url(out: Path) -> str:
    return f"sqlite:///{Path(out).resolve() / 'study.db'}"


def safe_url(url: str) -> str:
    """The URL without its password, for messages and the JSON result."""
    from sqlalchemy.engine import make_url  # heavy (sqlalchemy): loaded on first use

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - only used for display
        return url


def check_storage_url(url: str) -> None:
    from sqlalchemy.engine import make_url  # heavy (sqlalchemy): loaded on first use

    try:
        make_url(url)
    except Exception:  # noqa: BLE001 - ArgumentError, ValueError: one message
        raise UserError(f"--storage: cannot parse {url!r} as a SQLAlchemy URL; e.g. sqlite:///studies/s/study.db "
                        "or postgresql+psycopg://user:password@host/dbname") from None


def open_storage(url: str) -> Any:
    """An RDBStorage with heartbeats (tables are created on first use); a bad URL or server is a UserError."""
    import optuna  # heavy (optuna): loaded on first use

    check_storage_url(url)
    engine_kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=HEARTBEAT_GRACE_S
            )
        except Exception as e:  # noqa: BLE001 - driver missing, server unreachable, unwritable file...
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"--storage: cannot open {safe_url(url)} ({reason}); check the URL, the server and "
                            "that its driver is installed (postgresql: pip install psycopg[binary])") from None


def open_study(storage: Any, name: str, direction: str, metric: str, base_config: dict[str, Any]) -> Any:
    """Create the study, or continue it when it exists with the same metric, direction and base config."""
    import optuna  # heavy (optuna): loaded on first use

    try:
        existing = set(optuna.get_all_study_names(storage))
    except Exception as e:  # noqa: BLE001
        raise UserError(f"--storage: cannot read studies from {safe_url(storage.url)} ({e})") from None
    base_json = json.dumps(base_config, sort_keys=True)
    if name in existing:
        study = optuna.load_study(study_name=name, storage=storage)
        saved_metric = study.user_attrs.get("metric")
        saved_direction = study.direction.name.lower()
        if saved_metric != metric or saved_direction != direction:
            raise UserError(f"--study: study {name!r} optimizes {saved_metric} ({saved_direction}), not {metric} "
                            f"({direction}); pass --metric {saved_metric} --direction {saved_direction}, or choose "
                            "another --study or --out")
        saved = study.user_attrs.get("base_config")
        if saved is not None and saved != base_json:
            diff = config_differences(json.loads(saved), base_config)
            raise UserError(f"--study: study {name!r} was run with a different recipe or overrides (differs in "
                            f"{', '.join(diff[:3])}); rerun with the same ones, or choose another --study or --out")
        return study
    study = optuna.create_study(storage=storage, study_name=name, direction=direction)
    study.set_user_attr("metric", metric)
    study.set_user_attr("base_config", base_json)
    return study


def config_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys where two config dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in list(a) + [k for k in b if k not in a]:
            out += config_differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".") or "config"]


# ---------------------------------------------------------------- trial states


def is_finished(trial: Any) -> bool:
    """COMPLETE, PRUNED, or FAIL by a crash; see the module docstring."""
    from optuna.trial import TrialState  # heavy (optuna): loaded on first use

    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return trial.state == TrialState.FAIL and str(trial.user_attrs.get("fail_reason", "")).startswith(CRASHED)


def count_finished(trials: Iterable[Any]) -> int:
    return sum(1 for t in trials if is_finished(t))


def count_states(trials: Iterable[Any]) -> dict[str, int]:
    from optuna.trial import TrialState  # heavy (optuna): loaded on first use

    counts = {"complete": 0, "pruned": 0, "failed": 0, "running": 0}
    names = {TrialState.COMPLETE: "complete", TrialState.PRUNED: "pruned", TrialState.FAIL: "failed",
             TrialState.RUNNING: "running"}
    for t in trials:
        if t.state in names:
            counts[names[t.state]] += 1
    return counts


def _host_id() -> str:
    """This machine: its name plus its kernel's boot id (machines named alike, e.g. "vm", stay apart)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()


HOST = _host_id()


def pid_alive(pid: Any) -> bool:
    """Whether a process of this machine still runs (a zombie does not)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").is_file():
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fail_trial(storage: Any, trial: Any, reason: str) -> bool:
    """Mark a RUNNING trial FAIL with a reason; False when it had finished meanwhile."""
    import optuna  # heavy (optuna): loaded on first use
    from optuna.trial import TrialState  # heavy (optuna): loaded on first use

    try:
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
        return bool(storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL))
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def fail_dead_trials(study: Any, storage: Any, pids: Optional[set[int]] = None,
                     reason: Optional[Callable[[Any], str]] = None) -> list[int]:
    """FAIL this machine's RUNNING trials whose process is gone (or whose pid is in `pids`); trial numbers.

    Trials of other machines are left to the heartbeat: optuna fails them once their heartbeat is older
    than HEARTBEAT_GRACE_S (called here too, and by each worker before each trial).
    """
    import optuna  # heavy (optuna): loaded on first use
    from optuna.trial import TrialState  # heavy (optuna): loaded on first use

    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("pid")
        if t.user_attrs.get("host") != HOST:
            continue
        if (pid in pids) if pids is not None else not pid_alive(pid):
            why = reason(t) if reason else f"{INTERRUPTED} its process (pid {pid}) ended before the trial did"
            if fail_trial(storage, t, why):
                failed.append(t.number)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    return failed
