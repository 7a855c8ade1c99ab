"""`log.mlflow`: a run mirrored into MLflow (the embedded SQLite store, and a real `mlflow server` over HTTP), each
step once after a SIGKILL and a resume, a dead server costing one warning and nothing else, `trainforge runs sync`
uploading later from the run directory, and a tuning study's trials as children of one parent run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pytest
import yaml
from mlflow import MlflowClient

import trainforge
from trainforge.cli import main
from trainforge.metrics_file import read_metrics
from postgres_server import free_port

SRC = str(Path(trainforge.__file__).resolve().parents[1])
HERE = str(Path(__file__).parent)
TINY = ["data.source=digits", "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "model.name=mlp",
        "model.args={hidden: [16], dropout: 0.0}", "train.global_batch_size=64", "train.micro_batch_size=64",
        "train.early_stopping=null", "train.log_every_steps=1", "train.eval_every_steps=3", "log.progress=false",
        "log.tensorboard=false"]


def run_id_of(run_dir: Path) -> str:
    return json.loads((run_dir / "mlflow.json").read_text())["run_id"]


def history_steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def logged_steps(run_dir: Path, split: str) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == split]


def check_mirrored(client: MlflowClient, run_dir: Path, uri: str, model_name: str) -> None:
    """The MLflow run holds the run directory: params, each metric step once, artifacts, the registered model."""
    run = client.get_run(run_id_of(run_dir))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert run.info.status == "FINISHED" and run.info.run_name == run_dir.name
    assert run.data.params["optim.lr"] == str(config["optim"]["lr"]) and run.data.params["model.name"] == "mlp"
    assert run.data.params["model.args.hidden"] == "[16]"
    assert history_steps(client, run.info.run_id, "train/loss") == logged_steps(run_dir, "train")
    assert history_steps(client, run.info.run_id, "val/accuracy") == logged_steps(run_dir, "val")
    last = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"][-1]
    assert run.data.metrics["train/loss"] == pytest.approx(last["loss"])
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"config.yaml", "data_report.json",
                                                                        "eval.json", "report.html"}
    versions = client.search_model_versions(f"name='{model_name}'")
    assert [(str(v.version), v.run_id) for v in versions] == [("1", run.info.run_id)]
    mlflow.set_tracking_uri(uri)
    try:
        model = mlflow.pyfunc.load_model(f"models:/{model_name}/1")
    finally:
        mlflow.set_tracking_uri("")
    inputs = model.metadata.signature.inputs.inputs[0]
    assert inputs.shape == (-1, 1, 8, 8) and inputs.type == np.dtype("float32")
    assert model.predict(np.zeros((3, 1, 8, 8), np.float32)).shape == (3, 10)


def test_the_embedded_store_holds_the_run_its_model_and_a_second_run(tmp_path):
    root = tmp_path / "runs"
    overrides = [*TINY, "train.max_steps=6", f"log.runs_root={root}", "log.mlflow={register_model: digits-mlp}"]
    trainforge.train(None, overrides=overrides, run_dir=tmp_path / "a")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    assert json.loads((tmp_path / "a" / "mlflow.json").read_text())["tracking_uri"] == uri
    client = MlflowClient(uri)
    check_mirrored(client, tmp_path / "a", uri, "digits-mlp")
    trainforge.train(None, overrides=[*TINY, "train.max_steps=3", f"log.runs_root={root}", "log.mlflow={}"],
                     run_dir=tmp_path / "b")
    experiment = client.get_experiment_by_name("digits_cnn")  # the recipe's name
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["a", "b"]
    assert Path(experiment.artifact_location.removeprefix("file://")) == root / "mlflow-artifacts"


@pytest.mark.slow
def test_a_run_logs_to_a_tracking_server_over_http(tmp_path, mlflow_server):
    overrides = [*TINY, "train.max_steps=6", f"log.mlflow={{tracking_uri: '{mlflow_server}', experiment: team, "
                                             "register_model: digits-http}"]
    trainforge.train(None, overrides=overrides, run_dir=tmp_path / "run")
    client = MlflowClient(mlflow_server)
    check_mirrored(client, tmp_path / "run", mlflow_server, "digits-http")
    assert client.get_run(run_id_of(tmp_path / "run")).info.experiment_id == \
        client.get_experiment_by_name("team").experiment_id


def train_cli(run_dir: Path, *extra: str, env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "trainforge", "train", *TINY, *extra, "--run-dir", str(run_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_a_killed_and_resumed_run_is_one_mlflow_run_with_each_step_once(tmp_path):
    """SIGKILL in step 11 (checkpoints every 4 steps), once the follower has uploaded the rows up to the newest
    checkpoint (step 8) while the run went on, but not the rows of steps 9 and 10, which the resume writes again;
    the resumed run continues the same MLflow run."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE, os.environ.get("PYTHONPATH", "")]))
    root, run_dir = tmp_path / "runs", tmp_path / "run"
    extra = ["model.name=custom", "model.target=tracking_models:killed_after_upload",
             f"model.args={{kill_call: 11, marker: '{tmp_path / 'killed'}', state_file: '{run_dir / 'mlflow.json'}', "
             "uploaded: 8}", "train.max_steps=14",
             "train.checkpoint_every_steps=4", f"log.runs_root={root}", "log.mlflow={sync_every_s: 0.2}"]
    first = train_cli(run_dir, *extra, env=env)
    assert first.returncode == -9, first.stderr[-2000:]
    state = json.loads((run_dir / "mlflow.json").read_text())
    assert state["metrics_step"] == 8  # uploaded while running, never past the newest checkpoint
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    assert history_steps(client, state["run_id"], "train/loss") == list(range(1, state["metrics_step"] + 1))
    assert max(logged_steps(run_dir, "train")) > state["metrics_step"]  # rows the resume will write again
    second = train_cli(run_dir, *extra, "--resume", "auto", env=env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert run_id_of(run_dir) == state["run_id"]
    runs = client.search_runs([client.get_experiment_by_name("digits_cnn").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert history_steps(client, state["run_id"], "train/loss") == list(range(1, 15))  # each step once
    # ... with the values the run directory ends with: steps 9 and 10 as the resumed run wrote them again (their
    # timings differ from the killed attempt's), not as the killed attempt first wrote them
    rows = {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"}
    for key in ("loss", "step_time_s", "samples_per_s"):
        history = {m.step: m.value for m in client.get_metric_history(state["run_id"], f"train/{key}")}
        assert history == {step: pytest.approx(r[key]) for step, r in rows.items() if r.get(key) is not None}, key
    assert history_steps(client, state["run_id"], "val/loss") == [3, 6, 9, 12, 14]
    assert client.get_run(state["run_id"]).data.params["train.max_steps"] == "14"


def test_a_dead_server_costs_one_warning_and_runs_sync_uploads_later(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    dead = f"http://127.0.0.1:{free_port()}"
    overrides = [*TINY, "train.max_steps=6", f"log.mlflow={{tracking_uri: '{dead}', sync_every_s: 0.05}}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = trainforge.train(None, overrides=overrides, run_dir=tmp_path / "run")
    assert result.status == "completed" and (tmp_path / "run" / "final" / "model.json").is_file()
    said = [str(w.message) for w in caught if "log.mlflow" in str(w.message)]
    assert len(said) == 1 and dead in said[0] and f"trainforge runs sync {tmp_path / 'run'}" in said[0]
    assert not (tmp_path / "run" / "mlflow.json").exists()

    store = f"sqlite:///{tmp_path / 'later.db'}"
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # nothing goes to the working directory (MLflow's default: ./mlruns)
    with pytest.raises(SystemExit) as done:
        main(["runs", "sync", str(tmp_path / "run"), "--tracking-uri", store, "--json"])
    assert done.value.code in (None, 0)
    doc = json.loads(capsys.readouterr().out)
    client = MlflowClient(store)
    assert client.get_run(doc["run_id"]).info.status == "FINISHED"
    assert history_steps(client, doc["run_id"], "train/loss") == logged_steps(tmp_path / "run", "train")
    with pytest.raises(SystemExit) as again:  # nothing twice: the run's mlflow.json says what is there
        main(["runs", "sync", str(tmp_path / "run"), "--json"])
    assert again.value.code in (None, 0) and json.loads(capsys.readouterr().out)["run_id"] == doc["run_id"]
    assert history_steps(client, doc["run_id"], "train/loss") == logged_steps(tmp_path / "run", "train")
    assert list((tmp_path / "cwd").iterdir()) == [] and (tmp_path / "mlflow-artifacts").is_dir()
    with pytest.raises(SystemExit) as bad:
        main(["runs", "sync", str(tmp_path)])
    assert bad.value.code == 2 and "not a run directory" in capsys.readouterr().err


def test_without_mlflow_installed_log_mlflow_is_one_line_before_any_work(tmp_path, monkeypatch):
    import importlib.util

    from trainforge.errors import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(UserError, match=r"log.mlflow: MLflow is not installed; pip install -e '.\[tracking\]'"):
        trainforge.train(None, overrides=[*TINY, "train.max_steps=1", "log.mlflow={}"], run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_tuning_study_logs_each_trial_as_a_child_of_one_parent(tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("optim.lr: {type: float, low: 1.0e-3, high: 5.0e-2, log: true}\n")
    root, out = tmp_path / "runs", tmp_path / "study"
    args = ["tune", "digits_cnn", *TINY, "train.max_steps=6", "train.num_threads=1", f"log.runs_root={root}",
            "log.mlflow={}", "--space", str(space), "--out", str(out), "--json"]
    for trials in ("1", "2"):  # the continued study gathers its new trial under the same parent
        with pytest.raises(SystemExit) as done:
            main([*args, "--trials", trials])
        assert done.value.code in (None, 0), capsys.readouterr().err[-2000:]
        capsys.readouterr()
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("digits_cnn").experiment_id])
    parents = [r for r in runs if r.data.tags.get("trainforge.study") == "digits_cnn"]
    assert len(parents) == 1 and parents[0].info.run_name == "study digits_cnn"
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == 2 and len(runs) == 3
    assert sorted(r.info.run_name for r in children) == ["trial-0000", "trial-0001"]
    assert parent.data.metrics["best/accuracy"] == max(c.data.metrics["val/accuracy"] for c in children)
    best_child = max(children, key=lambda c: c.data.metrics["val/accuracy"])
    assert parent.info.status == "FINISHED" and parent.data.tags["best.optim.lr"] == best_child.data.params["optim.lr"]


@pytest.mark.slow
def test_compress_logs_the_recommended_onnx_variant_as_a_new_model_version(tmp_path, capsys):
    """Through the command line and the Python API alike: each composes the MLflow observer with compress (which
    imports no tracking) and each compression of the run is a new version of its registered model."""
    import shutil

    root = tmp_path / "runs"
    trainforge.train(None, overrides=[*TINY, "train.max_steps=3", f"log.runs_root={root}",
                                      "log.mlflow={register_model: digits-onnx}"], run_dir=tmp_path / "run")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # the CLI exits 0 on its own
        main(["compress", str(tmp_path / "run"), "--quantize", "none", "--bench-seconds", "0.05", "--json"])
    assert exit_.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    assert doc["mlflow"]["run_id"] == run_id_of(tmp_path / "run") and doc["mlflow"]["onnx_version"] == "2"
    shutil.rmtree(tmp_path / "run" / "compressed")
    again = trainforge.compress(tmp_path / "run", quantize="none", bench_s=0.05, progress=False)
    assert again["mlflow"]["run_id"] == run_id_of(tmp_path / "run") and again["mlflow"]["onnx_version"] == "3"
    client = MlflowClient(uri)
    assert sorted(str(v.version) for v in client.search_model_versions("name='digits-onnx'")) == ["1", "2", "3"]
    mlflow.set_tracking_uri(uri)
    try:
        torch_model, onnx_model = (mlflow.pyfunc.load_model(f"models:/digits-onnx/{v}") for v in (1, 2))
    finally:
        mlflow.set_tracking_uri("")
    x = np.random.default_rng(0).normal(size=(4, 1, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(onnx_model.predict(x), torch_model.predict(x), rtol=1e-4, atol=1e-4)


@pytest.mark.serial
@pytest.mark.slow
def test_a_two_process_run_is_one_mlflow_run_logged_by_rank_0(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    root = tmp_path / "runs"
    proc = train_cli(tmp_path / "run", "train.max_steps=6", "train.micro_batch_size=32", "train.device=cpu",
                     f"log.runs_root={root}", "log.mlflow={sync_every_s: 0.2}", "--nproc-per-node", "2", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("digits_cnn").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == run_id_of(tmp_path / "run")
    assert runs[0].info.status == "FINISHED"
    assert history_steps(client, runs[0].info.run_id, "train/loss") == logged_steps(tmp_path / "run", "train")
