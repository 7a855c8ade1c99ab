"""A job's MLflow mirror, attacked through the tracking server (issue 26, findings 1 and 2): a server that answers
with an artifact location on this machine (another job's run directory, a folder outside every root) or on another
host; a submitter who names a tracking server of their own to collect the operator's credentials. And the same
mirror through a real `mlflow server` that serves artifacts itself, which must keep working."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from fake_tracking import FakeTracking
from jobs_helpers import landlock_missing, make_service, stop_all_jobs, wait_for, with_steps
from test_jobs_sandbox import SECRETS, tree_digest
from trainforge.errors import UserError
from trainforge.jobs.service import Submission
from trainforge.jobs.store import FINAL_STATES

REFUSAL = "not behind its own artifact proxy (mlflow-artifacts:); a job of the server stores nothing there"

pytestmark = pytest.mark.skipif(bool(landlock_missing()), reason=landlock_missing() or "-")


def run_all(service, jobs, timeout_s: float = 240) -> list:
    """Schedule and watch (the server's loop, ticked here) until every job has ended."""
    def ended() -> bool:
        service.tick()
        return all(service.get(j.id).state in FINAL_STATES for j in jobs)

    try:
        wait_for(ended, timeout_s, "the jobs to end", 0.2)
    finally:
        stop_all_jobs(service)
    return [service.get(j.id) for j in jobs]


def mlflow_job(uri: str, experiment: str, steps: int = 4) -> Submission:
    return Submission("digits_cnn", overrides=(*with_steps(steps), "train.eval_every_steps=2",
                                               f"log.mlflow={{tracking_uri: '{uri}', experiment: {experiment}}}"))


def log_of(service, job) -> str:
    return Path(service.paths(job.id).log).read_text()


@pytest.mark.slow
def test_a_lying_tracking_server_cannot_make_a_job_write_outside_its_run_or_send_credentials_elsewhere(
        tmp_path, monkeypatch):
    for name, value in SECRETS.items():  # the operator's credentials, in the server's environment
        monkeypatch.setenv(name, value)
    outside = tmp_path / "outside"  # a folder outside every root, which the server's user can write
    outside.mkdir()
    (outside / "notes.txt").write_text("the operator's notes\n")
    with FakeTracking() as allowed, FakeTracking() as elsewhere:
        service = make_service(tmp_path, "cpu:2", tracking_uri_allow=[allowed.uri])
        [victim] = run_all(service, [service.enqueue(Submission("digits_cnn", overrides=tuple(with_steps(6))))])
        assert victim.state == "succeeded", victim.reason
        victim_run = Path(victim.run_dir)
        victim_eval = json.loads((victim_run / "eval.json").read_text())
        before = {p: tree_digest(p) for p in (victim_run, outside)}

        # an allowed server gone bad: each experiment is told another place to keep its artifacts
        allowed.by_experiment = {"into-victim": victim_run.as_uri(), "outside": str(outside),  # file: and a bare path
                                 "other-host": f"mlflow-artifacts://127.0.0.1:{elsewhere.uri.rsplit(':', 1)[1]}/stolen"}
        with pytest.raises(UserError, match="log.mlflow.tracking_uri: .* is not a tracking server this server allows"):
            service.enqueue(mlflow_job(elsewhere.uri, "direct"))  # a submitter's own server: refused at admission
        attackers = run_all(service, [service.enqueue(mlflow_job(allowed.uri, name)) for name in allowed.by_experiment])

    for job in attackers:
        assert job.state == "succeeded", job.reason  # the attacker's job itself trains on
        lines = [line for line in log_of(service, job).splitlines() if line.startswith("log.mlflow:")]
        assert len(lines) == 1 and REFUSAL in lines[0], lines
        assert "Traceback" not in log_of(service, job) and "UserWarning" not in log_of(service, job)
        assert not any(Path(job.run_dir).parent.glob("**/stolen*"))
    assert {p: tree_digest(p) for p in (victim_run, outside)} == before
    assert json.loads((victim_run / "eval.json").read_text()) == victim_eval  # the victim's result is its own
    assert elsewhere.requests == []  # nothing, so no credential, reached the other host
    basic = "Basic " + base64.b64encode(f"{SECRETS['MLFLOW_TRACKING_USERNAME']}:"
                                        f"{SECRETS['MLFLOW_TRACKING_PASSWORD']}".encode()).decode()
    sent = allowed.headers_seen()
    assert sent and all(h.get("Authorization") == basic for h in sent)  # the allowed server: the operator's own


@pytest.mark.slow
def test_a_job_mirrors_its_run_into_an_allowed_mlflow_server_that_serves_its_artifacts(tmp_path, mlflow_server):
    from mlflow import MlflowClient

    service = make_service(tmp_path, "cpu:1", tracking_uri_allow=[mlflow_server])
    job = service.enqueue(Submission("digits_cnn", overrides=(
        *with_steps(4), "train.eval_every_steps=2", "log.report=true",  # the report is one of the artifacts
        f"log.mlflow={{tracking_uri: '{mlflow_server}', experiment: server-jobs, register_model: server-digits}}")))
    [job] = run_all(service, [job])
    assert job.state == "succeeded", job.reason
    assert "log.mlflow" not in log_of(service, job), log_of(service, job)[-2000:]
    state = json.loads((Path(job.run_dir) / "mlflow.json").read_text())
    client = MlflowClient(mlflow_server)
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED" and run.info.artifact_uri.startswith("mlflow-artifacts:")
    assert {"config.yaml", "eval.json", "report.html"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    assert [h.step for h in client.get_metric_history(run.info.run_id, "train/loss")][-1] == 4
    assert client.get_model_version("server-digits", "1").run_id == run.info.run_id  # the model went up too
