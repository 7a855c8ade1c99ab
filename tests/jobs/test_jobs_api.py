"""The JSON API and dashboard pages through FastAPI's TestClient: schema, validation, tokens, no external URLs."""
from __future__ import annotations

import re
from pathlib import Path

import warnings

import pytest

with warnings.catch_warnings():  # starlette's note about its httpx-based TestClient is not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from jobs_helpers import QUICK, make_service
from trainforge.jobs.server import create_app

STATIC = Path(__file__).resolve().parents[2] / "src" / "trainforge" / "jobs"


@pytest.fixture
def service(tmp_path):
    return make_service(tmp_path)


CLIENT = {"X-Trainforge-Client": "test"}  # what the CLI and the dashboard send with every state change


@pytest.fixture
def client(service):
    with TestClient(create_app(service, manage_service=False), headers=CLIENT) as c:  # no scheduler loop: jobs stay queued
        yield c


def test_openapi_describes_the_api(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path, method in [("/api/jobs", "get"), ("/api/jobs", "post"), ("/api/jobs/{job_id}", "get"),
                         ("/api/jobs/{job_id}/logs", "get"), ("/api/jobs/{job_id}/metrics", "get"),
                         ("/api/jobs/{job_id}/cancel", "post"), ("/api/gpus", "get"), ("/api/health", "get")]:
        assert method in paths[path], (path, method)
    assert "/" not in paths  # the dashboard pages are not API


def test_submit_show_logs_metrics_cancel(client, service):
    r = client.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": QUICK, "priority": 3, "max_restarts": 2})
    assert r.status_code == 201, r.text
    job = r.json()
    assert {k: job[k] for k in ("id", "name", "state", "gpus", "restarts")} == \
        {"id": 1, "name": "digits_cnn", "state": "queued", "gpus": [], "restarts": 0}
    assert job["run_dir"] == str(service.state_dir / "jobs" / "1" / "run")
    assert job["memory_bytes"] > 0 and job["progress"]["total_steps"] == 20

    detail = client.get("/api/jobs/1").json()
    assert "max_steps: 20" in detail["config_yaml"] and detail["priority"] == 3
    assert [j["id"] for j in client.get("/api/jobs").json()] == [1]
    assert client.get("/api/jobs/1/logs").json() == {"text": "", "offset": 0, "state": "queued"}
    assert client.get("/api/jobs/1/metrics").json()["train"] == []
    assert client.post("/api/jobs/1/cancel").json()["state"] == "cancelled"
    assert client.get("/api/jobs/1").json()["reason"] == "cancelled by the user"

    missing = client.get("/api/jobs/42")
    assert missing.status_code == 404 and "job 42 does not exist" in missing.json()["detail"]


@pytest.mark.parametrize("body, message", [
    ({"recipe": "digits_cnn", "overrides": ["train.max_steps=lots"]}, "train.max_steps: expected an integer"),
    ({"recipe": "digits_cnn", "overrides": ["--run-dir=/etc"]}, "--run-dir: unknown key"),
    ({"recipe": "/etc/passwd"}, "not a built-in recipe"),
    ({"recipe": "digits_cnn", "command": "rm -rf /"}, "command: Extra inputs are not permitted"),
    ({"recipe": "digits_cnn", "gpus": 0}, "gpus: Input should be greater than or equal to 1"),
    ({"recipe": "digits_cnn", "gpus": 3}, "asks for 3 GPUs"),
    ({"recipe": "digits_cnn", "overrides": ["model.name=custom", "model.target=os:system"]}, "custom code"),
])
def test_bad_submissions_are_400_with_one_line(client, body, message):
    r = client.post("/api/jobs", json=body)
    assert r.status_code == 400, r.text
    assert message in r.json()["detail"] and "\n" not in r.json()["detail"]
    assert client.get("/api/jobs").json() == []


def test_a_job_that_can_never_fit_is_400(tmp_path):
    service = make_service(tmp_path, "cpu:2", slot_memory_gb=0.001)
    with TestClient(create_app(service, manage_service=False), headers=CLIENT) as c:
        r = c.post("/api/jobs", json={"recipe": "digits_cnn"})
    assert r.status_code == 400 and "largest slot holds 1.0 MiB" in r.json()["detail"]


def test_only_json_bodies_are_accepted(client):
    # a cross-site HTML form can send text/plain without a CORS preflight; it must not queue anything
    r = client.post("/api/jobs", content='{"recipe": "digits_cnn"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 400
    assert client.get("/api/jobs").json() == []


def test_a_token_guards_every_call(service):
    app = create_app(service, token="s3cret-token", manage_service=False)
    with TestClient(app, headers=CLIENT) as c:
        for path in ("/api/jobs", "/api/gpus", "/api/recipes", "/api/jobs/1", "/api/jobs/1/logs", "/openapi.json"):
            assert c.get(path).status_code == 401, path
        assert c.post("/api/jobs", json={"recipe": "digits_cnn"}).status_code == 401
        assert c.post("/api/jobs/1/cancel").status_code == 401
        assert c.get("/api/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/api/jobs", headers={"Cookie": "trainforge_token=s3cret-token"}).status_code == 401  # header only
        ok = c.get("/api/jobs", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200 and ok.json() == []
        # the pages are shells the scripts fill from the API: served without the token, they hold no data
        sub = c.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [*QUICK, "name=private-name"]},
                     headers={"Authorization": "Bearer s3cret-token"})
        assert sub.status_code == 201, sub.text
        for path in ("/", "/jobs/1", "/gpus", "/static/common.js", "/?token=s3cret-token"):
            page = c.get(path, follow_redirects=False)
            assert page.status_code == 200, path
            assert "private-name" not in page.text and "digits_cnn" not in page.text and "cpu0" not in page.text
            assert "set-cookie" not in page.headers, path  # nothing a page on another port of this host would receive


def test_a_loopback_server_refuses_other_host_names(service):
    app = create_app(service, allowed_hosts=["127.0.0.1", "localhost"], manage_service=False)
    with TestClient(app, base_url="http://127.0.0.1:8765") as c:
        assert c.get("/api/health").status_code == 200
    with TestClient(app, base_url="http://attacker.example") as c:  # DNS rebinding
        assert c.get("/api/health").status_code == 400


def test_dashboard_pages_render_and_escape(client):
    evil = "<img src=x onerror=alert(1)>"
    assert client.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [*QUICK, f"name={evil}"]}).status_code == 201
    index = client.get("/")
    assert index.status_code == 200 and 'id="submit-form"' in index.text and 'id="login"' in index.text
    assert evil not in index.text  # the name reaches the page only through the API and textContent
    page = client.get("/jobs/1")
    assert page.status_code == 200 and 'id="chart-loss"' in page.text and 'data-job-id="1"' in page.text
    gpus = client.get("/gpus")
    assert gpus.status_code == 200 and 'id="slots"' in gpus.text
    assert client.get("/api/jobs/1").json()["name"] == evil
    assert client.get("/jobs/abc").status_code == 400
    for path in ("/static/common.js", "/static/jobs.js", "/static/job.js", "/static/chart.js", "/static/gpus.js",
                 "/static/style.css"):
        assert client.get(path).status_code == 200, path
    scripts = "".join((STATIC / "static" / f).read_text() for f in ("common.js", "jobs.js", "job.js", "gpus.js"))
    assert "innerHTML" not in scripts and "document.cookie" not in scripts


def test_nothing_is_loaded_from_elsewhere():
    files = [*(STATIC / "templates").glob("*.html"), *(STATIC / "static").glob("*")]
    assert len(files) >= 9
    for f in files:
        urls = re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", f.read_text())
        assert [u for u in urls if not u.startswith("http://www.w3.org/2000/svg")] == [], f.name


def test_the_validation_picture_is_served_and_a_planted_link_is_not(client, service, tmp_path):
    """/api/jobs/ID/val_images.png: the run's val_images.png (detection, segmentation draw one at each evaluation),
    404 until there is one; the run directory is the job's to write, so a link there, a file that is not a PNG or a
    fifo is never read through (404 too), and the val rows' map reaches the dashboard's metric chart."""
    import json
    import os

    import numpy as np
    from PIL import Image

    assert client.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": QUICK}).status_code == 201
    run = Path(client.get("/api/jobs/1").json()["run_dir"])
    missing = client.get("/api/jobs/1/val_images.png")
    assert missing.status_code == 404 and "no validation images" in missing.json()["detail"]
    run.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((4, 6, 3), "uint8")).save(run / "val_images.png")
    shown = client.get("/api/jobs/1/val_images.png")
    assert shown.status_code == 200 and shown.headers["content-type"] == "image/png"
    assert shown.content == (run / "val_images.png").read_bytes()
    secret = tmp_path / "secret.png"
    secret.write_bytes((run / "val_images.png").read_bytes())  # a PNG, even: the link itself is refused
    (run / "val_images.png").unlink()
    os.symlink(secret, run / "val_images.png")
    assert client.get("/api/jobs/1/val_images.png").status_code == 404
    (run / "val_images.png").unlink()
    (run / "val_images.png").write_text("root:x:0:0")
    assert client.get("/api/jobs/1/val_images.png").status_code == 404
    (run / "val_images.png").unlink()
    os.mkfifo(run / "val_images.png")  # opened without blocking, then refused as not a regular file
    assert client.get("/api/jobs/1/val_images.png").status_code == 404
    (run / "metrics.jsonl").write_text(json.dumps({"split": "val", "step": 2, "map": 0.25, "map_50": 0.5}) + "\n")
    assert client.get("/api/jobs/1/metrics").json()["val"] == [{"step": 2, "map": 0.25, "map_50": 0.5}]
