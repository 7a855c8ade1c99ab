"""A run directory, mirrored into an MLflow run: what `log.mlflow` does during training and `trainforge runs sync`
does afterwards (docs/tracking.md).

    tracker = RunTracker(run_dir, settings, runs_root)       # settings: the run's log.mlflow (MlflowConfig)
    tracker.sync()                                           # new rows up to the latest checkpoint, changed files
    tracker.sync(status="FINISHED")                          # everything, the final model, the run's end state

    with follow(run_dir, settings, runs_root) as following:  # rank 0 of a run: syncs every sync_every_s
        result = fit(...)
        following.finish(result.status)

The tracker only reads the run directory, so it never slows or breaks the training loop, and an upload that
failed can be made later from the same files. What it has uploaded is kept in `<run>/mlflow.json`: the MLflow
run's id (a resumed run continues the same MLflow run), the last step whose metrics are uploaded, and the size
and mtime of each artifact uploaded. Metrics are uploaded only up to the newest checkpoint while a run goes on:
rows after it may be rewritten by a resume after a crash (metrics.jsonl is cut back to the checkpoint), and
MLflow keeps every point it is sent. So a killed and resumed run has each step once in MLflow's history.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence
from urllib.parse import urlsplit

import yaml

from trainforge.config import MlflowConfig
from trainforge.confine import confined_roots
from trainforge.engine.hooks import FitHooks
from trainforge.errors import UserError, quote
from trainforge.files import write_text_atomic
from trainforge.metrics_file import read_metrics
from trainforge.layout import (CHECKPOINTS, COMPRESS_RECORD, COMPRESSED, CONFIG, DATA_REPORT, EVAL, FINAL, LATEST, MANIFEST,
                               META, METRICS, MLFLOW_STATE, REPORT, step_of)
from trainforge.tasks import TASKS

STATE_FILE = MLFLOW_STATE
ARTIFACTS = (CONFIG, DATA_REPORT, EVAL, REPORT)
# the MLflow models' code (MLflow's "models from code"), beside this file; named by path: MLflow runs them, trainforge
# never imports them
PYFUNC_CODE = Path(__file__).parent / "pyfunc_model.py"  # a run's final model
PYFUNC_ONNX_CODE = Path(__file__).parent / "pyfunc_onnx.py"  # its compressed ONNX variant
METRICS_PER_BATCH = 1000  # MLflow's limits on one log_batch call
PARAMS_PER_BATCH = 100
PARAM_VALUE_CHARS = 6000
NOT_METRICS = ("split", "step")
QUIET_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",  # a dead server fails fast
             "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
END_STATUS = {"completed": "FINISHED", "early_stopped": "FINISHED", "interrupted": "KILLED", "pruned": "KILLED",
              "failed": "FAILED"}


class TrackingError(Exception):
    """The tracker could not be reached or refused something: the run goes on, `trainforge runs sync` later."""


class ArtifactsRefused(TrackingError):
    """A job of the server was told to store artifacts somewhere other than its tracking server's artifact proxy:
    nothing is uploaded (the run goes on, its files complete); said in one line."""


PROXIED = ("mlflow-artifacts",)  # the tracking server's own artifact proxy (`mlflow server --serve-artifacts`)
RESOLVING = ("runs", "models")  # names of other artifact locations, each judged when MLflow resolves it


def check_artifact_uri(artifact_uri: str, uri: str, what: str) -> None:
    """In a job of the server: artifacts go only to the tracking server `uri` itself, through its artifact proxy
    (`mlflow-artifacts:` on the same host, or http(s) on the same scheme and host). A local scheme (`file:`, a bare
    path) would write on this machine, wherever the tracking server says; another host would get the operator's
    credentials. ArtifactsRefused otherwise."""
    parts, tracking = urlsplit(artifact_uri), urlsplit(uri)
    scheme, netloc = parts.scheme.lower(), parts.netloc.lower()
    if scheme in PROXIED and netloc in ("", tracking.netloc.lower()):
        return
    if scheme == tracking.scheme.lower() and scheme in ("http", "https") and netloc == tracking.netloc.lower():
        return
    raise ArtifactsRefused(f"log.mlflow: the tracking server {uri} keeps this run's {what} at {quote(artifact_uri)}, "
                           "not behind its own artifact proxy (mlflow-artifacts:); a job of the server stores nothing "
                           "there, so this run is not mirrored to MLflow (its files are complete; ask the operator to "
                           "serve artifacts through the tracking server)")


def guard_artifact_repositories(uri: str, own: Sequence[Path]) -> None:
    """Every artifact repository MLflow opens in this process goes through `check_artifact_uri` first (models it
    logs included, whose location the tracking server chooses separately), through MLflow's own registry of
    repositories, the point where plugins add theirs. Local folders under `own` (the run directory, the temp
    folder) stay open: MLflow copies a model's files from there before uploading them."""
    from mlflow.store.artifact.artifact_repository_registry import _artifact_repository_registry as registry  # optional

    mine = [Path(os.path.realpath(p)) for p in own]

    def is_own(artifact_uri: str) -> bool:
        parts = urlsplit(artifact_uri)
        if parts.scheme.lower() not in ("", "file") or parts.netloc not in ("", "localhost"):
            return False
        real = Path(os.path.realpath(parts.path))
        return any(real == m or m in real.parents for m in mine)

    for scheme, factory in list(registry.get_registered_artifact_repositories().items()):
        if scheme in RESOLVING or getattr(factory, "trainforge_guarded", False):
            continue

        def guarded(artifact_uri: str, *args: Any, _factory: Any = factory, **kwargs: Any) -> Any:
            if not is_own(artifact_uri):
                check_artifact_uri(artifact_uri, uri, "artifacts")
            return _factory(artifact_uri, *args, **kwargs)

        guarded.trainforge_guarded = True  # type: ignore[attr-defined]
        registry.register(scheme, guarded)


def require_mlflow() -> None:
    """UserError (before any work) when MLflow is not installed: it is an optional extra."""
    if importlib.util.find_spec("mlflow") is None:
        raise UserError("log.mlflow: MLflow is not installed; pip install -e '.[tracking]' (or pip install mlflow), "
                        "or remove log.mlflow")


def tracking_uri(settings: MlflowConfig, runs_root: Path, recorded: Optional[str] = None,
                 explicit: Optional[str] = None) -> str:
    """`explicit` (runs sync --tracking-uri), else the one the run logged to before (`recorded`, from its mlflow.json:
    a resume or a later sync continues there), else log.mlflow.tracking_uri, else $MLFLOW_TRACKING_URI, else the
    embedded store `sqlite:///<runs_root>/mlflow.db`."""
    uri = explicit or recorded or settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{(Path(runs_root).resolve() / 'mlflow.db')}"


def artifact_location(uri: str) -> Optional[str]:
    """Where a new experiment keeps its artifacts: beside a local SQLite store (`<its folder>/mlflow-artifacts`; MLflow's
    own default would be ./mlruns in whatever directory the command runs in); a server's default otherwise."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlflow-artifacts").as_uri()


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """A config as dotted keys: {"optim": {"lr": 0.1}} -> {"optim.lr": "0.1"} (lists and None as YAML text)."""
    if isinstance(tree, dict) and tree:
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    text = tree if isinstance(tree, str) else yaml.safe_dump(tree, default_flow_style=True).strip()
    if text.endswith("\n..."):
        text = text[:-4].strip()
    return {prefix[:-1]: text[:PARAM_VALUE_CHARS]}


def latest_checkpoint_step(run_dir: Path) -> int:
    """The step of checkpoints/latest (0 when there is none): rows up to it are never rewritten by a resume."""
    try:
        name = (run_dir / CHECKPOINTS / LATEST).read_text().strip()
        return step_of(name)
    except (OSError, ValueError):
        return 0


def metric_points(rows: list[dict[str, Any]]) -> Iterator[tuple[str, float, int]]:
    """(key, value, step) of every number in metrics.jsonl rows: `<split>/<name>`, e.g. train/loss, val/accuracy."""
    for row in rows:
        split, step = row.get("split"), row.get("step")
        if not isinstance(split, str) or not isinstance(step, int):
            continue
        for key, value in row.items():
            if key in NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            yield f"{split}/{key}", float(value), step


def recorded_uri(directory: Path) -> Optional[str]:
    """The tracking URI a run directory (or a study's) was uploaded to, from its mlflow.json."""
    try:
        uri = json.loads((directory / STATE_FILE).read_text()).get("tracking_uri")
    except (OSError, ValueError, AttributeError):
        return None
    return uri if isinstance(uri, str) else None


@dataclass
class SyncState:
    """<run>/mlflow.json: what this run directory has uploaded, to which tracker."""

    tracking_uri: str
    run_id: str = ""
    experiment_id: str = ""
    params: bool = False
    metrics_step: int = -1  # rows with a step up to this one are uploaded
    artifacts: dict[str, list[int]] = field(default_factory=dict)  # name -> [size, mtime_ns] uploaded
    model_step: Optional[int] = None  # the final model's step, once logged
    model_version: Optional[str] = None  # its registered version
    onnx_record: Optional[list[int]] = None  # compressed/compress.json's [size, mtime_ns] when its variant was logged
    onnx_version: Optional[str] = None  # the ONNX variant's registered version

    @classmethod
    def read(cls, run_dir: Path, uri: str) -> "SyncState":
        try:
            doc = json.loads((run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return cls(uri)
        if not isinstance(doc, dict) or doc.get("tracking_uri") != uri:  # another tracker: a run of its own there
            return cls(uri)
        try:
            return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})
        except TypeError:
            return cls(uri)

    def write(self, run_dir: Path) -> None:
        write_text_atomic(run_dir / STATE_FILE, json.dumps(self.__dict__, indent=1) + "\n")


class RunTracker:
    """One run directory's MLflow run (see the module docstring)."""

    def __init__(self, run_dir: Path, settings: MlflowConfig, runs_root: Path, uri: Optional[str] = None,
                 parent_run_id: Optional[str] = None) -> None:
        self.parent_run_id = parent_run_id  # a tuning study's run (stage.mlflow_parent_run_id): this run its child
        self.run_dir, self.settings = Path(run_dir), settings
        self.uri = tracking_uri(settings, runs_root, recorded_uri(self.run_dir), uri)
        self.state = SyncState.read(self.run_dir, self.uri)
        self.lock = threading.Lock()  # the follower's thread and the final sync never upload at once
        self.resumed = False  # this process has marked a continued MLflow run as running again
        self.confined = confined_roots() is not None  # a job of the server: artifacts only through the proxy
        self.checked = False  # this process has checked where the run's artifacts go

    def sync(self, status: Optional[str] = None) -> SyncState:
        """Upload what is new. `status` (an MLflow run status): the run is over: every row, the final model, the end
        state. TrackingError when the tracker fails (what was uploaded before stays recorded)."""
        with self.lock, _quiet_mlflow():
            try:
                self._sync(status)
            except TrackingError:
                raise
            except Exception as e:  # noqa: BLE001  MLflow raises MlflowException, requests' and SQLAlchemy's errors
                raise TrackingError(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]) from e
            finally:
                if self.state.run_id:
                    self.state.write(self.run_dir)
        return self.state

    def _sync(self, status: Optional[str]) -> None:
        from mlflow import MlflowClient  # optional dependency (the `tracking` extra), heavy to import

        client = MlflowClient(self.uri)
        if not self.state.run_id or not self._exists(client):
            self._create(client)
        elif status is None and not self.resumed:
            client.update_run(self.state.run_id, status="RUNNING")  # a resumed run is running again
            self.resumed = True
        if self.confined and not self.checked:  # before this process uploads anything
            self._check_artifacts(client)
        if not self.state.params:
            self._log_params(client)
        self._log_metrics(client, final=status == "FINISHED")  # a failed run may be resumed: its rows may change
        for name in ARTIFACTS:
            self._log_artifact(client, name)
        if status is not None:
            if status == "FINISHED" and (self.run_dir / FINAL / META).is_file():
                self._log_model()
                if (self.run_dir / COMPRESSED / COMPRESS_RECORD).is_file():
                    self._log_onnx()
            client.set_terminated(self.state.run_id, status=status)

    def _check_artifacts(self, client: Any) -> None:
        guard_artifact_repositories(self.uri, own=(self.run_dir, Path(tempfile.gettempdir())))
        experiment = client.get_experiment(self.state.experiment_id)
        check_artifact_uri(str(experiment.artifact_location), self.uri, "experiment's artifacts")
        check_artifact_uri(str(client.get_run(self.state.run_id).info.artifact_uri), self.uri, "artifacts")
        self.checked = True

    def _exists(self, client: Any) -> bool:
        from mlflow.exceptions import MlflowException  # optional dependency, see _sync

        try:
            return client.get_run(self.state.run_id).info.lifecycle_stage == "active"
        except MlflowException:
            return False  # deleted on the server, or another store: a new MLflow run, uploaded from the start

    def _create(self, client: Any) -> None:
        config = self._config()
        name = self.settings.experiment or str(config.get("name") or "trainforge")
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            experiment_id = client.create_experiment(name, artifact_location=artifact_location(self.uri))
        else:
            experiment_id = experiment.experiment_id
        tags = {"trainforge.run_dir": str(self.run_dir.resolve()), "mlflow.source.name": "trainforge"}
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        run = client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags)
        self.state = SyncState(self.uri, run_id=run.info.run_id, experiment_id=experiment_id)

    def _config(self) -> dict[str, Any]:
        try:
            doc = yaml.safe_load((self.run_dir / CONFIG).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise UserError(f"{self.run_dir / CONFIG}: not readable ({e}); is this a run directory?") from None
        return doc if isinstance(doc, dict) else {}

    def _log_params(self, client: Any) -> None:
        from mlflow.entities import Param  # optional dependency, see _sync

        params = [Param(k, v) for k, v in sorted(flatten(self._config()).items())]
        for start in range(0, len(params), PARAMS_PER_BATCH):
            client.log_batch(self.state.run_id, params=params[start : start + PARAMS_PER_BATCH])
        self.state.params = True

    def _log_metrics(self, client: Any, final: bool) -> None:
        from mlflow.entities import Metric  # optional dependency, see _sync

        path = self.run_dir / METRICS
        if not path.is_file():
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a line being written as it is read: picked up next time
            rows = read_metrics(path)
        limit = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=-1) if final else \
            latest_checkpoint_step(self.run_dir)
        new = [r for r in rows if isinstance(r.get("step"), int) and self.state.metrics_step < r["step"] <= limit]
        now = int(time.time() * 1000)
        points = [Metric(key, value, now, step) for key, value, step in metric_points(new)]
        for start in range(0, len(points), METRICS_PER_BATCH):
            client.log_batch(self.state.run_id, metrics=points[start : start + METRICS_PER_BATCH])
        self.state.metrics_step = max(self.state.metrics_step, limit)

    def _log_artifact(self, client: Any, name: str) -> None:
        path = self.run_dir / name
        try:
            st = path.stat()
        except OSError:
            return
        stamp = [st.st_size, st.st_mtime_ns]
        if self.state.artifacts.get(name) == stamp:
            return
        client.log_artifact(self.state.run_id, str(path))
        self.state.artifacts[name] = stamp

    def _log_model(self) -> None:
        """final/ as an MLflow pyfunc model (trainforge loads it; input signature from the data), registered under
        log.mlflow.register_model when set. Once per final model (its step)."""
        import mlflow  # optional dependency, see _sync

        meta = json.loads((self.run_dir / FINAL / META).read_text())
        if self.state.model_step == meta.get("step"):
            return
        with _tracking(self.uri), mlflow.start_run(run_id=self.state.run_id, log_system_metrics=False):
            info = mlflow.pyfunc.log_model(
                name="model", python_model=str(PYFUNC_CODE), artifacts={FINAL: str(self.run_dir / FINAL)},
                signature=signature(meta["data_info"]), registered_model_name=self.settings.register_model,
                pip_requirements=["trainforge", "torch", "numpy", "safetensors"], await_registration_for=60)
        self.state.model_step = meta.get("step")
        version = getattr(info, "registered_model_version", None)
        self.state.model_version = str(version) if version is not None else None


    def _log_onnx(self) -> None:
        """`trainforge compress`'s recommended ONNX variant as a second MLflow model (served with onnxruntime, no
        torch), registered as a new version of log.mlflow.register_model. Again only when compress.json changes."""
        import mlflow  # optional dependency, see _sync

        compressed = self.run_dir / COMPRESSED
        st = (compressed / COMPRESS_RECORD).stat()
        if self.state.onnx_record == [st.st_size, st.st_mtime_ns]:
            return
        record = json.loads((compressed / COMPRESS_RECORD).read_text())
        chosen = next((v for v in record.get("variants", []) if v.get("recommended")), None)
        if chosen is None or not (compressed / Path(str(chosen.get("path", ""))).name).is_file():
            return  # nothing to serve yet (an unfinished compress)
        meta = json.loads((self.run_dir / FINAL / META).read_text())
        with tempfile.TemporaryDirectory(prefix="trainforge-onnx-") as tmp:  # the variant, its record and manifest
            folder = Path(tmp) / COMPRESSED
            folder.mkdir()
            for name in (COMPRESS_RECORD, MANIFEST, Path(str(chosen["path"])).name):
                if (compressed / name).is_file():
                    shutil.copy2(compressed / name, folder / name)
            with _tracking(self.uri), mlflow.start_run(run_id=self.state.run_id, log_system_metrics=False):
                info = mlflow.pyfunc.log_model(
                    name="onnx_model", python_model=str(PYFUNC_ONNX_CODE), artifacts={"compressed": str(folder)},
                    signature=signature(meta["data_info"]), registered_model_name=self.settings.register_model,
                    pip_requirements=["trainforge", "onnxruntime", "numpy"], await_registration_for=60)
        self.state.onnx_record = [st.st_size, st.st_mtime_ns]
        version = getattr(info, "registered_model_version", None)
        self.state.onnx_version = str(version) if version is not None else None


def signature(data_info: dict[str, Any]) -> Any:
    """The MLflow model's input (and output) tensor spec, from final/model.json's data_info."""
    import numpy as np
    from mlflow.models import ModelSignature  # optional dependency, see RunTracker._sync
    from mlflow.types import Schema, TensorSpec

    shape = tuple(int(d) for d in data_info["input_shape"])
    dtype = np.dtype(data_info.get("input_dtype", "float32"))
    classes = int(data_info["num_classes"])
    inputs = Schema([TensorSpec(dtype, (-1, *shape))])
    try:
        out = TASKS.get(data_info["task"]).output_shape(shape, classes)
    except NotImplementedError:  # outputs that are not one tensor (a detector's boxes per image): inputs only
        return ModelSignature(inputs=inputs)
    return ModelSignature(inputs=inputs, outputs=Schema([TensorSpec(np.dtype("float32"), out)]))


@contextlib.contextmanager
def _tracking(uri: str) -> Iterator[None]:
    """The fluent API's tracking URI for a block (model logging has no client-side form)."""
    import mlflow  # optional dependency, see RunTracker._sync

    before = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(before or "")


@contextlib.contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow's own retries, warnings, notices and progress bars stay off the run's console (and off stdout, which
    `--json` keeps for one document); failures are ours to say. The environment settings are defaults only."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    logger = logging.getLogger("mlflow")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


class Following:
    """A running run's tracker on a thread: `sync()` every sync_every_s; the first failure is said once (the run
    goes on) and ends the following; `finish(status)` makes the last, complete upload."""

    def __init__(self, tracker: RunTracker) -> None:
        self.tracker, self.failed = tracker, False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="trainforge-mlflow", daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.tracker.settings.sync_every_s):
            self._try(None)
            if self.failed:
                return

    def _try(self, status: Optional[str]) -> None:
        if self.failed:
            return
        try:
            self.tracker.sync(status)
        except ArtifactsRefused as e:  # not a failure to retry later: a refusal, in one line
            self.failed = True
            print(str(e), file=sys.stderr, flush=True)
        except (TrackingError, UserError) as e:
            self.failed = True
            warn_failed(self.tracker, str(e))

    def finish(self, status: str) -> None:
        self.stop.set()
        self.thread.join()
        self._try(END_STATUS.get(status, "FINISHED"))


def warn_failed(tracker: RunTracker, why: str) -> None:
    warnings.warn(f"log.mlflow: uploading to {tracker.uri} failed ({why}); the run goes on, its files are complete: "
                  f"upload it later with `trainforge runs sync {tracker.run_dir}`", stacklevel=2)


@contextlib.contextmanager
def follow(run_dir: Path, settings: Optional[MlflowConfig], runs_root: Path,
           parent_run_id: Optional[str] = None) -> Iterator[Optional[Following]]:
    """Follow a run into MLflow while it trains (rank 0 only; nothing when `settings` is None). An exception out of
    the block ends the MLflow run as FAILED; the block calls `finish(status)` itself when the run ends."""
    if settings is None:
        yield None
        return
    require_mlflow()
    following = Following(RunTracker(run_dir, settings, runs_root, parent_run_id=parent_run_id))
    following.thread.start()
    try:
        yield following
    except BaseException:
        following.finish("failed")
        raise
    finally:
        if not following.stop.is_set():
            following.finish("completed")


class MlflowObserver:
    """log.mlflow as a run's observer (engine.hooks.RunObserver): MLflow must be installed when the config asks
    for it, rank 0 follows the run directory while it trains, and what compress adds to it afterwards is uploaded."""

    def check(self, cfg: Any) -> None:
        if cfg.log.mlflow is not None:
            require_mlflow()

    def follow(self, run_dir: Path, cfg: Any) -> contextlib.AbstractContextManager[Optional[Following]]:
        return follow(run_dir, cfg.log.mlflow, Path(cfg.log.runs_root), cfg.stage.mlflow_parent_run_id)

    def publish(self, run_dir: Path, cfg: Any) -> Optional[dict[str, Any]]:
        if cfg.log.mlflow is None:
            return None
        return sync_run_dir(run_dir, cfg.log.mlflow, Path(cfg.log.runs_root))


def tracked(hooks: Optional[FitHooks] = None) -> FitHooks:
    """`hooks` (or none) with the MLflow observer added: how the training API, the command line, tune and compress
    compose tracking with a run (training and compression import no tracking)."""
    hooks = hooks if hooks is not None else FitHooks()
    return hooks if hooks.observer is not None else replace(hooks, observer=MlflowObserver())


def sync_run_dir(run_dir: Path, settings: MlflowConfig, runs_root: Path, uri: Optional[str] = None,
                 parent_run_id: Optional[str] = None) -> dict[str, Any]:
    """`trainforge runs sync`: upload a finished or stopped run from its directory (JSON-able summary); `uri`: to this
    tracking URI rather than the one `tracking_uri` chooses."""
    if not (run_dir / CONFIG).is_file():
        raise UserError(f"RUN_DIR: {run_dir} is not a run directory (no config.yaml)")
    require_mlflow()
    tracker = RunTracker(run_dir, settings, runs_root, uri, parent_run_id)
    status = "FINISHED" if (run_dir / FINAL / META).is_file() else "KILLED"
    try:
        state = tracker.sync(status)
    except TrackingError as e:
        raise UserError(f"log.mlflow.tracking_uri: uploading to {tracker.uri} failed ({e}); check that the tracking "
                        "server is up and reachable, then run `trainforge runs sync` again") from None
    return {"run_dir": str(run_dir), "tracking_uri": tracker.uri, "run_id": state.run_id,
            "experiment_id": state.experiment_id, "metrics_step": state.metrics_step, "status": status,
            "artifacts": sorted(state.artifacts), "model_version": state.model_version,
            "onnx_version": state.onnx_version}


# ---------------------------------------------------------------------------------------------- tuning studies

def study_parent(out: Path, settings: MlflowConfig, runs_root: Path, study: str) -> Optional[str]:
    """The MLflow run of a tuning study (each trial's run is its child): created once and kept in <out>/mlflow.json,
    so a continued study gathers its new trials under the same parent. None, with one warning, when the tracker
    fails (the trials then log as runs of their own, or not at all, each saying so)."""
    require_mlflow()
    path = Path(out) / STATE_FILE
    uri = tracking_uri(settings, runs_root, recorded_uri(Path(out)))
    try:
        kept = json.loads(path.read_text())
        if kept.get("tracking_uri") == uri and isinstance(kept.get("run_id"), str):
            return kept["run_id"]
    except (OSError, ValueError, AttributeError):
        pass
    tracker = RunTracker(Path(out), settings, runs_root)
    with _quiet_mlflow():
        try:
            from mlflow import MlflowClient  # optional dependency, see RunTracker._sync

            client = MlflowClient(uri)
            name = settings.experiment or study
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(
                name, artifact_location=artifact_location(uri))
            run = client.create_run(experiment_id, run_name=f"study {study}",
                                    tags={"trainforge.study": study, "trainforge.study_dir": str(Path(out).resolve()),
                                          "mlflow.source.name": "trainforge tune"})
        except Exception as e:  # noqa: BLE001  see RunTracker.sync
            warn_failed(tracker, f"{type(e).__name__}: {e}"[:300])
            return None
    SyncState(uri, run_id=run.info.run_id, experiment_id=experiment_id).write(Path(out))
    return run.info.run_id


def finish_study(out: Path, settings: MlflowConfig, runs_root: Path, parent_run_id: str,
                 best: dict[str, Any]) -> None:
    """The study's run gets its best trial's value and parameters, and ends; a failure is one warning."""
    tracker = RunTracker(Path(out), settings, runs_root)
    with _quiet_mlflow():
        try:
            from mlflow import MlflowClient  # optional dependency, see RunTracker._sync
            from mlflow.entities import Metric, RunTag

            client = MlflowClient(tracker.uri)
            now = int(time.time() * 1000)
            metrics = [Metric(f"best/{best['metric']}", float(best["value"]), now, 0)] if best.get("value") is not None \
                else []
            # tags, not params: a continued study's best trial may change, and MLflow never lets a param change
            tags = [RunTag(f"best.{k}", str(v)[:PARAM_VALUE_CHARS]) for k, v in sorted(best.get("params", {}).items())]
            if best.get("number") is not None:
                tags.append(RunTag("best.trial", str(best["number"])))
            client.log_batch(parent_run_id, metrics=metrics, tags=tags)
            client.set_terminated(parent_run_id, status="FINISHED")
        except Exception as e:  # noqa: BLE001  see RunTracker.sync
            warn_failed(tracker, f"{type(e).__name__}: {e}"[:300])
