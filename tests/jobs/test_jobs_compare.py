"""Comparing jobs from the dashboard (issue 18): tick jobs on the jobs page, "Compare selected" opens /compare, which
draws their runs from GET /api/compare (one curve per job on each chart, the config keys that differ, the test
metrics). The API holds the data and takes the token; the page holds none; nothing here changes state."""
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import pytest
import yaml

with warnings.catch_warnings():  # starlette's note about its httpx-based TestClient is not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from jobs_helpers import CHROMIUM_MISSING, LiveServer, make_service
from trainforge.config import load_config
from trainforge.jobs.server import SECURITY_HEADERS, create_app

CLIENT = {"X-Trainforge-Client": "test"}
LRS = (0.001, 0.003, 0.01)
HOSTILE = "<img src=x onerror=document.title='pwned'>"


def fake_run(run_dir: Path, lr: float, accuracy: float) -> None:
    """The files a 6-step digits run leaves, with made-up numbers: config.yaml, metrics.jsonl, final/, eval.json."""
    run_dir.mkdir(parents=True)
    cfg = load_config("digits_cnn", [f"optim.lr={lr}", "train.max_steps=6"]).model_dump(mode="json")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    rows = [{"split": "train", "step": s, "epoch": s / 18, "loss": 2.3 - lr * 20 * s, "micro_batch_size": 64}
            for s in (2, 4, 6)]
    rows += [{"split": "val", "step": s, "epoch": s / 18, "loss": 2.2 - lr * 20 * s, "accuracy": accuracy * s / 6}
             for s in (2, 4, 6)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "final").mkdir()
    (run_dir / "final" / "model.json").write_text(json.dumps({"step": 6, "ran": {"device": "cpu", "world_size": 1,
                                                                               "micro_batch_size": 64}}))
    (run_dir / "eval.json").write_text(json.dumps({"split": "test", "step": 6, "loss": 1.5, "accuracy": accuracy}))


def add_job(service, name: str, lr: float = 0.0, accuracy: float = 0.5, state: str = "succeeded") -> int:
    """A job in the store as if it had run (its run directory written by `fake_run`), or a queued one without a run."""
    job = service.store.create(job_dir_for=lambda i: str(service.paths(i).path), name=name, recipe="digits_cnn",
                               overrides=[], config_yaml="name: x\n", num_gpus=1, priority=0, max_restarts=0,
                               memory_bytes=2**20, total_steps=6)
    if state != "queued":
        fake_run(Path(job.run_dir), lr, accuracy)
        service.store.finish(job.id, state)
    return job.id


@pytest.fixture
def service(tmp_path):
    service = make_service(tmp_path)
    for i, lr in enumerate(LRS):
        add_job(service, "digits_cnn" if i < 2 else HOSTILE, lr, accuracy=0.5 + 0.1 * i)
    add_job(service, "waiting", state="queued")  # job 4: no run yet
    return service


def one_line(r, status: int, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert "\n" not in detail and len(detail) < 300, detail
    for w in words:
        assert w in detail, detail


def test_the_api_compares_the_jobs_runs(service):
    with TestClient(create_app(service, manage_service=False), headers=CLIENT) as api:
        doc = api.get("/api/compare?ids=1&ids=2&ids=3").json()
    assert doc["ids"] == [1, 2, 3]
    assert [r["label"] for r in doc["runs"]] == ["job 1: digits_cnn", "job 2: digits_cnn", f"job 3: {HOSTILE}"]
    assert [r["status"] for r in doc["runs"]] == ["completed"] * 3
    assert doc["config_differences"] == {"optim.lr": list(LRS)}
    assert doc["test_metrics"]["accuracy"] == [0.5, 0.6, 0.7]
    curves = {c["id"]: c for c in doc["curves"]}
    assert set(curves) == {"train-loss", "val-loss", "val-accuracy"}
    for curve in curves.values():
        assert [s["run"] for s in curve["series"]] == [r["label"] for r in doc["runs"]]
        assert all([p[0] for p in s["points"]] == [2, 4, 6] for s in curve["series"])


@pytest.mark.parametrize("query, status, words, page", [  # page: the answer of /compare, which checks only the form
    ("ids=1", 400, ["ids", "at least 2"], 400),
    ("", 400, ["ids"], 400),
    ("ids=1&ids=1", 400, ["ids", "twice"], 200),
    ("ids=1&ids=4", 400, ["job 4 has no run yet", "queued"], 200),
    ("ids=1&ids=99", 404, ["job 99 does not exist"], 200),
    ("ids=0&ids=1", 400, ["ids"], 400),
    (f"ids=1&ids={2**63}", 400, ["ids"], 400),
    ("ids=1&ids=two", 400, ["ids"], 400),
    ("&".join(f"ids={i}" for i in range(1, 12)), 400, ["ids", "at most 10"], 400),
])
def test_bad_ids_are_refused_in_one_line(service, query, status, words, page):
    with TestClient(create_app(service, manage_service=False), headers=CLIENT) as api:
        one_line(api.get("/api/compare?" + query), status, *words)
        assert api.get("/api/compare.html?" + query).status_code == status
        assert api.get("/compare?" + query).status_code == page


def test_the_data_needs_the_token_and_the_page_holds_none(service):
    token = "compare-token-0123456789"
    before = [(j.id, j.state, j.finished_at) for j in service.store.list()]
    with TestClient(create_app(service, token=token, manage_service=False), headers=CLIENT) as api:
        for path in ("/api/compare?ids=1&ids=2", "/api/compare.html?ids=1&ids=2"):
            assert api.get(path).status_code == 401
        page = api.get("/compare?ids=1&ids=3")  # served without the token, like every page: a shell
        assert page.status_code == 200 and "optim.lr" not in page.text and "onerror" not in page.text
        assert '<script src="/static/compare.js">' in page.text
        auth = {"Authorization": f"Bearer {token}"}
        assert api.get("/api/compare?ids=1&ids=2", headers=auth).status_code == 200
        file = api.get("/api/compare.html?ids=1&ids=3", headers=auth)
        assert file.status_code == 200 and file.headers["content-type"].startswith("text/html")
        assert file.headers["content-disposition"] == 'attachment; filename="compare.html"'
        assert '<meta name="generator" content="trainforge comparison">' in file.text  # `runs compare`'s page
        assert "<img" not in file.text and "&lt;img src=x" in file.text
        for r in (page, file):
            for name, value in SECURITY_HEADERS.items():
                assert r.headers.get(name) == value, name
        assert api.post("/api/compare?ids=1&ids=2", headers=auth).status_code == 405  # reading only
    assert [(j.id, j.state, j.finished_at) for j in service.store.list()] == before


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")
def test_tick_jobs_and_compare_them_in_the_browser(service, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with LiveServer(service, manage_service=False) as server:
        browser.get(server.url + "/")
        wait = WebDriverWait(browser, 30, poll_frequency=0.2)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#jobs tr[data-job-id="3"]'))
        button = browser.find_element(By.ID, "compare")
        assert not button.is_enabled()
        for job_id in (1, 3):
            browser.find_element(By.CSS_SELECTOR, f'#jobs input[type=checkbox][data-job-id="{job_id}"]').click()
        time.sleep(2.5)  # a refresh of the table (every 2 s) keeps the ticks
        ticked = browser.find_elements(By.CSS_SELECTOR, "#jobs input[type=checkbox]:checked")
        assert sorted(box.get_attribute("data-job-id") for box in ticked) == ["1", "3"]
        browser.find_element(By.CSS_SELECTOR, '#jobs input[type=checkbox][data-job-id="2"]').click()
        button.click()

        wait.until(lambda d: d.current_url.endswith("/compare?ids=1&ids=2&ids=3"))
        labels = ["job 1: digits_cnn", "job 2: digits_cnn", f"job 3: {HOSTILE}"]
        for chart in ("train-loss", "val-loss", "val-accuracy"):
            paths = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f"#chart-{chart} path.series"))
            assert [p.get_attribute("data-series") for p in paths] == labels, chart
            assert all(p.get_attribute("data-points") == "3" for p in paths), chart
        rows = browser.find_elements(By.CSS_SELECTOR, "#config-differences tbody tr")
        assert [(r.get_attribute("data-key"), [td.text for td in r.find_elements(By.TAG_NAME, "td")]) for r in rows] == [
            ("optim.lr", ["0.001", "0.003", "0.01"])]
        accuracy = browser.find_element(By.CSS_SELECTOR, '#test-metrics tr[data-key="accuracy"]')
        assert [td.text for td in accuracy.find_elements(By.TAG_NAME, "td")] == ["0.5", "0.6", "0.7"]
        names = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#compare-runs tbody th")]
        assert names == labels  # the hostile name as text
        assert browser.title == "compare job 1, job 2, job 3 · trainforge"
        assert browser.execute_script("return document.images.length") == 0
