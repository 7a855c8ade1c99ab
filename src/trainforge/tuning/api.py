"""`trainforge.tune(...)`: check everything, open or continue the study, run the workers, write the results.

    result = trainforge.tune("digits_cnn", "recipes/sweeps/digits_cnn.yaml", trials=20, parallel=2,
                             overrides=["train.epochs=5"])
    result["best_trial"]       # {"number", "value", "params"}; result is what `trainforge tune --json` prints

`trials` is the TOTAL number of finished trials the study should hold: rerunning the same call after an
interruption runs only the remainder (see trainforge.tuning.study for what counts as finished).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import optuna
from optuna.trial import TrialState

from trainforge.config import load_config, parse_override
from trainforge.console import err
from trainforge.errors import JobFailed, UserError
from trainforge.files import write_text_atomic
from trainforge.tasks import TASKS
from trainforge.tracking.mlflow_run import finish_study, study_parent
from trainforge.tuning.report import write_study_report
from trainforge.tuning.results import (
    BEST_CONFIG,
    REPORT,
    TRIALS_CSV,
    best_config_text,
    format_value,
    param_keys,
    trial_rows,
    write_trials_csv,
)
from trainforge.tuning.space import load_space
from trainforge.tuning.study import (
    OPTUNA_DIRECTION,
    DIRECTIONS,
    PRUNERS,
    check_storage_url,
    count_finished,
    count_states,
    default_storage_url,
    fail_dead_trials,
    open_storage,
    open_study,
    safe_url,
)
from trainforge.tuning.workers import placement, run_workers

STUDIES_ROOT = "studies"


def tune(
    recipe: Optional[Union[str, Path]],
    space: Union[str, Path],
    *,
    trials: int,
    overrides: Sequence[str] = (),
    parallel: int = 1,
    storage: Optional[str] = None,
    study: Optional[str] = None,
    pruner: str = "median",
    metric: Optional[str] = None,
    direction: Optional[str] = None,
    out: Optional[Union[str, Path]] = None,
    log: Optional[Callable[[str], None]] = None,
) -> dict[str, Any]:
    """Tune `recipe` (a path or built-in name) over the search space file `space`; see the module docstring.

    Each trial trains into <out>/trials/trial-NNNN/ with the recipe + `overrides` + its sampled values.
    out defaults to studies/<study>, study to the recipe's name, storage to sqlite:///<out>/study.db.
    `log(line)` receives one line per finished trial (default: stderr).
    """
    if log is None:
        log = lambda line: err.print(line, highlight=False, soft_wrap=True)  # noqa: E731
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    # ---- flags first: nothing is read or written before they are known to be good
    if not isinstance(trials, int) or trials < 1:
        raise UserError(f"--trials: must be at least 1, got {trials}")
    if not isinstance(parallel, int) or parallel < 1:
        raise UserError(f"--parallel: must be at least 1 worker process, got {parallel}")
    PRUNERS.get(pruner)
    if direction is not None and direction not in DIRECTIONS:
        raise UserError(f"--direction: must be maximize or minimize, got {direction!r}")
    overrides = list(overrides)
    cfg = load_config(None if recipe is None else str(recipe), overrides)
    study_name = study or cfg.name
    if out is None:
        if not study_name or any(c in study_name for c in "/\\\0") or study_name.startswith("."):
            raise UserError(f"--study: {study_name!r} cannot name a folder; pass --out DIR or a plain study name")
        out = Path(STUDIES_ROOT) / study_name
    out = Path(out)
    if storage is not None:
        check_storage_url(storage)
    storage_url = storage or default_storage_url(out)

    # ---- the data (task -> default metric) and the space, checked against the config
    from trainforge.engine.preflight import preflight  # heavy (torch): flags are checked before it loads
    from trainforge.training.api import check_names  # heavy (torch): flags are checked before it loads

    check_names(cfg)
    base = cfg.model_dump(mode="json")
    info = preflight(cfg, fit_stats=False, on_meta=True).data.info  # what each trial's run would refuse, now
    space_params = load_space(space, base, info)
    task = TASKS.get(info.task)
    metric = metric or task.default_metric
    task.check_metric(metric, "--metric")
    direction = direction or OPTUNA_DIRECTION[task.direction(metric)]
    user_keys = {".".join(parse_override(o)[0]) for o in overrides}
    for key in space_params:
        if key in user_keys:
            log(f"note: {key} is both overridden and in the search space; the sampled value is used")

    # ---- the study: create or continue
    store = open_storage(storage_url) if storage else None  # a server's problems show before any folder is made
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out: cannot create {out} ({e.strerror}); choose a writable folder") from None
    store = store or open_storage(storage_url)
    the_study = open_study(store, study_name, direction, metric, base)
    parent = None
    if cfg.log.mlflow is not None:  # each trial's MLflow run a child of the study's
        parent = study_parent(out, cfg.log.mlflow, Path(cfg.log.runs_root), study_name)
    stale = fail_dead_trials(the_study, store)
    for number in stale:
        log(f"trial {number} was left running by a stopped tune run: marked failed (it does not count)")
    done = count_finished(the_study.get_trials(deepcopy=False))
    if done >= trials:
        log(f"study {study_name} already holds {done} finished trials (--trials {trials} is the total wanted); "
            "nothing to run")
    else:
        place = placement(parallel, user_keys, gpu_count=0 if cfg.train.device == "cpu" else None)
        trial_base = base
        if parent is not None:
            trial_base = {**base, "stage": {**base.get("stage", {}), "mlflow_parent_run_id": parent}}
        spec = {
            "base_config": trial_base,
            "space": {k: p.to_dict() for k, p in space_params.items()},
            "metric": metric,
            "out": str(out.resolve()),
            "storage": storage_url,
            "study": study_name,
            "pruner": pruner,
            "worker_overrides": place.overrides,
        }
        where = f"{len(place.gpus)} GPU(s)" if place.gpus else "CPU"
        log(f"study {study_name}: {done} of {trials} trials finished; running {trials - done} in "
            f"{min(parallel, trials - done)} worker(s) on {where}; storage {safe_url(storage_url)}")
        printer = _TrialPrinter(the_study, metric, trials, log)
        run_workers(the_study, store, spec, wanted=trials, parallel=min(parallel, trials - done),
                    recipe_seed=cfg.seed, place=place, on_trial=printer)

    result = write_results(the_study, out, base, list(space_params), study_name, safe_url(storage_url), metric,
                           direction)
    if parent is not None:
        finish_study(out, cfg.log.mlflow, Path(cfg.log.runs_root), parent, {"metric": metric, **(result["best_trial"] or {})})
    return result


class _TrialPrinter:
    """One line per finished trial: state, value, time, parameters, and how many are done."""

    def __init__(self, study: Any, metric: str, wanted: int, log: Callable[[str], None]) -> None:
        self.study, self.metric, self.wanted, self.log = study, metric, wanted, log

    def __call__(self, number: int) -> None:
        trials = self.study.get_trials(deepcopy=False)
        t = next((t for t in trials if t.number == number), None)
        if t is None:
            return
        params = ", ".join(f"{k}={format_value(v)}" for k, v in t.params.items())
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else 0.0
        state = t.state.name.lower()
        if state == "complete":
            what = f"{self.metric} {format_value(t.value)}"
        elif state == "pruned":
            what = f"at evaluation {t.last_step}, {self.metric} {format_value(t.value)}"
        else:
            what = str(t.user_attrs.get("fail_reason", "no reason recorded"))
        self.log(f"trial {number} {state}: {what} in {seconds:.1f} s [{count_finished(trials)}/{self.wanted}] {params}")


def write_results(study: Any, out: Path, base: dict[str, Any], space_keys: list[str], study_name: str,
                  storage: str, metric: str, direction: str) -> dict[str, Any]:
    """best_config.yaml (when a trial completed), trials.csv, report.html; returns the JSON summary."""
    trials = study.get_trials(deepcopy=False)
    keys = param_keys(trials, space_keys)
    rows = trial_rows(trials, keys)
    counts = count_states(trials)
    best = None
    best_text = None
    best_path = out / BEST_CONFIG
    if any(t.state == TrialState.COMPLETE for t in trials):
        b = study.best_trial
        best = {"number": b.number, "value": b.value, "params": dict(b.params), "run_dir": b.user_attrs.get("run_dir")}
        best_text = best_config_text(best_path, base, b, study_name, metric)
        write_text_atomic(best_path, best_text)
    csv_path = write_trials_csv(out / TRIALS_CSV, rows, keys)
    summary = {"study": study_name, "storage": storage, "metric": metric, "direction": direction,
               "trials": len(trials), **counts}
    if best is not None:
        summary.update({"best trial": best["number"], f"best {metric}": best["value"],
                        **{f"best {k}": v for k, v in best["params"].items()}})
    report_path = write_study_report(out / REPORT, study, rows, keys, summary, best_text)
    return {
        "study": study_name,
        "storage": storage,
        "out": str(out),
        "metric": metric,
        "direction": direction,
        "best_trial": best,
        "counts": {k: counts[k] for k in ("complete", "pruned", "failed")},
        "paths": {
            "best_config": str(best_path) if best is not None else None,
            "trials_csv": str(csv_path),
            "report": str(report_path),
        },
        "trials": rows,
        "param_keys": keys,
    }


def no_trial_completed(result: dict[str, Any]) -> Optional[JobFailed]:
    """The job failed when the study holds no complete trial at all (every one pruned or failed)."""
    if result["best_trial"] is None:
        c = result["counts"]
        return JobFailed(f"no trial completed ({c['pruned']} pruned, {c['failed']} failed); see the trial lines "
                         f"above and {result['paths']['trials_csv']}")
    return None
