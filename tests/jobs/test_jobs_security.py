"""The job server attacked as a user of the same machine would attack it: reading the server's files through a
submission, an alias bomb, a cross-site cancel, a token cookie that other ports receive, a submission that
blocks the others, absurd values, secrets in job processes. Each test performs the attack."""
from __future__ import annotations

import os
import stat
import threading
import time
import warnings
from pathlib import Path

import httpx
import pytest

with warnings.catch_warnings():  # starlette's note about its httpx-based TestClient is not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from jobs_helpers import QUICK, LiveServer, make_service, stop_all_jobs, trainer_pid, wait_for
from trainforge.confine import ENV as ROOTS_ENV
from trainforge.errors import UserError
from trainforge.jobs import service as service_module
from trainforge.jobs.server import SECURITY_HEADERS, create_app, is_loopback
from trainforge.jobs.service import Submission

CLIENT = {"X-Trainforge-Client": "test"}
PASSWD = "/etc/passwd"  # world-readable, and its first line is well known: root:x:0:0:...
MLP_CSV = ["model.name=mlp", "model.args={}", "data.augment.rotation_deg=0", "data.augment.crop_scale=null",
           "train.global_batch_size=8"]  # the small tables' training splits hold 14 rows
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"l{i}: &l{i} [" + ",".join([f"*{'a' if i == 1 else f'l{i - 1}'}"] * 9) + "]\n" for i in range(1, 12))


def client_for(service, token=None) -> TestClient:
    return TestClient(create_app(service, token=token, manage_service=False), headers=CLIENT)


def csv_job(path, *extra) -> dict:
    return {"recipe": "digits_cnn", "overrides": [*QUICK, "data.source=csv", f"data.path={path}", *MLP_CSV, *extra]}


def write_csv(path: Path, header: str, rows: int = 80) -> Path:
    path.write_text(header + "\n" + "".join(f"{i % 7},{i % 3},{i % 2}\n" for i in range(rows)))
    return path


@pytest.fixture
def api(tmp_path, data_root):
    with client_for(make_service(tmp_path, data_roots=[data_root])) as c:
        yield c


def refused(r, *words: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text)
    detail = r.json()["detail"]
    assert "\n" not in detail and "root:x:0" not in detail and "/bin/" not in detail, detail
    for w in words:
        assert w in detail, detail
    return detail


# ---------------------------------------------------------------- 1. no path outside the data roots is read


def test_without_data_roots_no_data_path_is_accepted(tmp_path):
    with client_for(make_service(tmp_path)) as c:  # the default: no --data-root
        for body in (csv_job(PASSWD), csv_job(PASSWD, "data.args.label_column=root"),
                     {"recipe": "charlm_gpt", "overrides": [*QUICK, f"data.path={PASSWD}", "data.args={}"]}):
            refused(c.post("/api/jobs", json=body), "data.path", "--data-root")
        assert c.get("/api/jobs").json() == []


def test_paths_leading_out_of_a_data_root_are_refused(api, data_root, tmp_path):
    (data_root / "escape.csv").symlink_to(PASSWD)
    (data_root / "sub").mkdir()
    for path, why in [(PASSWD, "outside the server's data roots"),
                      (f"{data_root}/sub/../../../../../../etc/passwd", "outside the server's data roots"),
                      (f"{data_root}/escape.csv", "symbolic link"),
                      ("data/escape.csv", "not an absolute path"),
                      (f"{data_root}/sub/../escape.csv", "symbolic link")]:
        refused(api.post("/api/jobs", json=csv_job(path, "data.args.label_column=root")), "data.path", why)
    refused(api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [
        *QUICK, "data.source=torchvision", "data.args={name: MNIST}", *MLP_CSV]}), "data.args.root")
    refused(api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [
        *QUICK, "data.source=torchvision", f"data.args={{name: MNIST, root: {data_root}}}", "data.download=true"]}),
        "data.download")


def test_api_errors_quote_no_file_content(api, data_root):
    secret = write_csv(data_root / "secret.csv", "SECRETHEADER,b,label")
    detail = refused(api.post("/api/jobs", json=csv_job(secret, "data.args.label_column=nope")), "data.args.label_column")
    assert "SECRETHEADER" not in detail
    cells = data_root / "cells.csv"
    cells.write_text("a,b,label\n" + "".join(f"{i},SECRETCELL{i},{i % 2}\n" for i in range(40)))
    detail = refused(api.post("/api/jobs", json=csv_job(cells)), "data.path")
    assert "SECRETCELL" not in detail and "column" in detail
    # a symbolic link inside a folder the recipe names, found while scanning it
    images = data_root / "images"
    for c in ("cats", "dogs"):
        (images / c).mkdir(parents=True)
    (images / "cats" / "x.png").symlink_to(PASSWD)
    refused(api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [
        *QUICK, "data.source=imagefolder", f"data.path={images}", "model.name=mlp", "model.args={}"]}),
        "symbolic link")
    good = write_csv(data_root / "good.csv", "a,b,label")
    assert api.post("/api/jobs", json=csv_job(good)).status_code == 201  # data under the root is fine


def test_a_job_process_is_held_to_the_same_roots(tmp_path, monkeypatch):
    from trainforge.config import load_config
    from trainforge.data import build_data

    root = (tmp_path / "root").resolve()
    (root / "text").mkdir(parents=True)
    (root / "text" / "a.txt").write_text("hello " * 200)
    (root / "text" / "b.txt").symlink_to(PASSWD)
    monkeypatch.setenv(ROOTS_ENV, str(root))

    def build(*overrides):
        return build_data(load_config("charlm_gpt", ["data.args={block_size: 16}", *overrides]).data, seed=0)

    with pytest.raises(UserError, match="b.txt.*symbolic link leading outside"):
        build(f"data.path={root / 'text'}")
    with pytest.raises(UserError, match="outside the server's data roots"):
        build(f"data.path={PASSWD}")
    (root / "text" / "b.txt").unlink()
    assert len(build(f"data.path={root / 'text'}").train) > 0
    monkeypatch.delenv(ROOTS_ENV)
    assert len(build(f"data.path={PASSWD}").train) >= 0  # the command line is not confined


@pytest.mark.serial  # a timing bar: measured with the machine to itself
@pytest.mark.slow
def test_a_slow_check_delays_no_other_answer(tmp_path, data_root):
    big = data_root / "big.csv"
    with open(big, "w") as f:  # about 5 s to read and clean: the slow submission
        f.write("a,b,c,label\n")
        block = "".join(f"{i % 7}.5,{i % 3},{i % 11},{i % 2}\n" for i in range(1000))
        f.writelines(block for _ in range(600))
    service = make_service(tmp_path, data_roots=[data_root])
    with LiveServer(service, manage_service=False) as server, httpx.Client(base_url=server.url, headers=CLIENT,
                                                                          timeout=120) as http:
        def small(i: int) -> float:
            t0 = time.monotonic()
            r = http.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [*QUICK, f"train.max_steps={30 + i}"]})
            assert r.status_code == 201, r.text
            return time.monotonic() - t0

        small(0)  # the fork server starts once
        alone = min(small(1), small(2))
        slow: dict = {}
        worker = threading.Thread(target=lambda: slow.update(r=http.post("/api/jobs", json=csv_job(big))))
        worker.start()
        time.sleep(1.0)  # the big file is being read now
        during = [small(3), small(4)]
        assert worker.is_alive(), "the slow submission was not slow: the test proves nothing"
        worker.join(120)
    assert slow["r"].status_code == 201, slow["r"].text
    print(f"answer alone {alone:.2f} s, while the slow check runs {during}")
    assert max(during) - alone < 1.0, (alone, during)


@pytest.mark.serial  # a timing bar: measured with the machine to itself
def test_checks_are_capped_in_time_and_memory(tmp_path, data_root):
    big = data_root / "big.csv"
    with open(big, "w") as f:
        f.write("a,b,c,label\n")
        f.writelines(f"{i},{i % 3},{i % 11},{i % 2}\n" for i in range(400_000))
    with client_for(make_service(tmp_path, data_roots=[data_root], admission_timeout_s=1.0)) as c:
        t0 = time.monotonic()
        refused(c.post("/api/jobs", json=csv_job(big)), "took longer than 1 s")
        assert time.monotonic() - t0 < 30
    (tmp_path / "m").mkdir()
    with client_for(make_service(tmp_path / "m", admission_memory_bytes=256 * 2**20)) as c:
        refused(c.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [
            *QUICK, "data.source=synthetic_images", "data.args={num_samples: 2000000000, image_size: 8}", *MLP_CSV,
            "data.normalize=none"]}), "memory")


# ---------------------------------------------------------------- 2, 5, 7, 8: size, recursion, values


@pytest.mark.serial  # a timing bar: measured with the machine to itself
def test_an_alias_bomb_is_refused_fast_and_small(api):
    assert len(BOMB) < 600
    t0 = time.monotonic()
    r = api.post("/api/jobs", json={"recipe": "bomb.yaml", "recipe_yaml": BOMB})
    assert time.monotonic() - t0 < 1.0 and len(r.content) < 10_000
    refused(r, "bomb.yaml", "aliases")
    r = api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": ["model.args=" + "[" * 3000 + "]" * 3000]})
    refused(r, "nested deeper")
    r = api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": ["name=" + "x" * 9000]})
    assert r.status_code == 400 and len(r.content) < 2_000


def test_bodies_and_the_admission_cache_are_bounded(api, monkeypatch):
    r = api.post("/api/jobs", content=b'{"recipe": "x", "recipe_yaml": "' + b"a" * (3 << 20) + b'"}',
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and len(r.content) < 1000

    def chunks():
        yield b'{"recipe": "x", "recipe_yaml": "'
        for _ in range(300):
            yield b"a" * 10_000
        yield b'"}'

    assert api.post("/api/jobs", content=chunks(), headers={"Content-Type": "application/json"}).status_code == 413
    monkeypatch.setattr(service_module, "ADMITTED_CACHE_SIZE", 3)
    for i in range(6):
        assert api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [*QUICK, f"seed={i}"]}).status_code == 201
    assert len(api.app.state.service._admitted) == 3


@pytest.mark.parametrize("method, path, body, status", [
    ("get", f"/api/jobs/{2**63}", None, 400),
    ("post", f"/api/jobs/{2**63}/cancel", None, 400),
    ("get", f"/api/jobs/{2**63 - 1}", None, 404),
    ("get", f"/api/jobs/1/logs?offset={2**70}", None, 400),
    ("get", "/jobs/99999999999999999999999", None, 400),
    ("post", "/api/jobs", {"recipe": "digits_cnn", "overrides": ["train.max_steps=99999999999999999999999"]}, 400),
    ("post", "/api/jobs", {"recipe": "digits_cnn", "overrides": ["train.max_steps=1e23"]}, 400),
    ("post", "/api/jobs", {"recipe": "digits_cnn", "overrides": ["optim.lr=.inf"]}, 400),
    ("post", "/api/jobs", {"recipe": "digits_cnn", "gpus": "1"}, 400),
    ("post", "/api/jobs", {"recipe": "digits_cnn", "gpus": True}, 400),
    ("post", "/api/jobs", {"recipe": "digits_cnn", "priority": 1.5}, 400),
    ("post", "/api/jobs", {"recipe": "dup.yaml", "recipe_yaml": "name: a\nname: b\n"}, 400),
    ("post", "/api/jobs", {"recipe": "empty.yaml", "recipe_yaml": ""}, 400),
])
def test_absurd_values_are_4xx_with_one_line(api, method, path, body, status):
    r = getattr(api, method)(path, **({"json": body} if body is not None else {}))
    assert r.status_code == status, r.text
    assert "\n" not in r.json()["detail"]


# ---------------------------------------------------------------- 3, 4, 10: cross-site, headers, token, files


def test_state_changes_refuse_cross_site_requests(api):
    assert api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": QUICK}).status_code == 201
    plain = TestClient(api.app)  # no X-Trainforge-Client header: what an HTML form sends
    for headers in ({}, {"Origin": "http://evil.example"}, {"Origin": "null"},
                    {"Origin": "http://evil.example", **CLIENT}, {"Origin": "http://testserver:8080", **CLIENT},
                    {"Sec-Fetch-Site": "cross-site", **CLIENT}, {"Sec-Fetch-Site": "same-site", **CLIENT}):
        r = plain.post("/api/jobs/1/cancel", headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert plain.post("/api/jobs", json={"recipe": "digits_cnn"}, headers=headers).status_code == 403
    assert api.get("/api/jobs/1").json()["state"] == "queued"
    ok = plain.post("/api/jobs/1/cancel", headers={"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin", **CLIENT})
    assert ok.status_code == 200 and ok.json()["state"] == "cancelled"


def test_every_response_carries_the_security_headers(api):
    answers = [api.get("/"), api.get("/jobs/1"), api.get("/static/common.js"), api.get("/api/jobs"),
               api.get("/api/jobs/7"), api.post("/api/jobs", json={"recipe": "nope"}),
               TestClient(api.app).post("/api/jobs/1/cancel"),
               api.post("/api/jobs", content=b"x" * (3 << 20), headers={"Content-Type": "application/json"})]
    assert [r.status_code for r in answers] == [200, 200, 200, 200, 404, 400, 403, 413]
    for r in answers:
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, (r.request.url, name)
        assert "set-cookie" not in r.headers
    assert "script-src 'self'" in SECURITY_HEADERS["Content-Security-Policy"]


def test_loopback_is_an_address_not_a_prefix():
    assert is_loopback("127.0.0.1") and is_loopback("127.4.5.6") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("127.evil.example") and not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
    assert not is_loopback("localhost.evil.example")


def test_the_token_comes_from_a_file_or_the_environment(tmp_path, monkeypatch, capsys):
    from trainforge.jobs.commands import server_token

    monkeypatch.delenv("TRAINFORGE_TOKEN", raising=False)
    f = tmp_path / "token"
    f.write_text("from-the-file\n")
    f.chmod(0o600)
    assert server_token(f, None) == "from-the-file"
    monkeypatch.setenv("TRAINFORGE_TOKEN", "from-the-env")
    assert server_token(None, None) == "from-the-env"
    monkeypatch.delenv("TRAINFORGE_TOKEN")
    assert server_token(None, "from-argv") == "from-argv"
    assert "`ps`" in capsys.readouterr().err  # --token works, with a warning
    with pytest.raises(UserError, match="--token-file: cannot read"):
        server_token(tmp_path / "missing", None)


@pytest.mark.slow
def test_job_processes_get_no_token_and_write_private_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_TOKEN", "server-secret-token")
    secrets = {"MLFLOW_TRACKING_PASSWORD": "op-password-123", "MLFLOW_TRACKING_TOKEN": "op-token-456",
               "AWS_SECRET_ACCESS_KEY": "aws-secret-789", "HF_TOKEN": "hf-token-000", "SSH_AUTH_SOCK": "/run/ssh-agent"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    service = make_service(tmp_path, "cpu:1")
    assert stat.S_IMODE(service.state_dir.stat().st_mode) == 0o700
    job = service.enqueue(Submission("digits_cnn", overrides=(*QUICK, "train.max_steps=400")))
    try:
        service.tick()
        job_dir = Path(service.get(job.id).run_dir).parent
        pid = wait_for(lambda: trainer_pid(job_dir), 60, "the trainer to start")
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"server-secret-token" not in environ and b"TRAINFORGE_TOKEN" not in environ
        for name, value in secrets.items():  # an allow-list of the server's environment: none of its secrets
            assert name.encode() not in environ and value.encode() not in environ, name
        assert ROOTS_ENV.encode() in environ and f"HOME={job_dir / 'tmp'}".encode() in environ
        status = Path(f"/proc/{pid}/status").read_text()  # inside its fence, without any capability
        assert "NoNewPrivs:\t1" in status and "CapEff:\t0000000000000000" in status, status
        wait_for(lambda: (job_dir / "run" / "config.yaml").exists(), 60, "the run to write its config")
        for path in (job_dir, job_dir / "run"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        for path in (job_dir / "log.txt", job_dir / "job.yaml", job_dir / "run" / "config.yaml"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    finally:
        service.cancel(job.id)
        stop_all_jobs(service)


# ---------------------------------------------------------------- in a real browser


def attacker_site(directory: Path):
    """A web server on another port of 127.0.0.1 that serves `directory` and records the headers it receives."""
    import http.server

    seen: list[dict] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(directory), **kw)

        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(dict(self.headers))
            super().do_GET()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, seen


def attack_page(target: str) -> str:
    """Auto-submitting forms (cancel job 1, queue a job) and a no-cors fetch, all aimed at `target`."""
    return f"""<!doctype html><html><body>
<form id="cancel" method="POST" action="{target}/api/jobs/1/cancel" target="f1"></form>
<form id="submit" method="POST" action="{target}/api/jobs" enctype="text/plain" target="f2">
<input name='{{"recipe": "digits_cnn", "x": "' value='"}}'></form>
<iframe name="f1"></iframe><iframe name="f2"></iframe>
<script>
document.getElementById("cancel").submit();
document.getElementById("submit").submit();
fetch("{target}/api/jobs/1/cancel", {{method: "POST", mode: "no-cors"}});
setTimeout(() => {{ document.title = "done"; }}, 1500);
</script></body></html>"""


@pytest.mark.slow
def test_a_cross_site_page_cannot_cancel_or_submit(tmp_path, browser):
    service = make_service(tmp_path, "cpu:1")
    site = tmp_path / "site"
    site.mkdir()
    with LiveServer(service, manage_service=False) as server:
        assert httpx.post(server.url + "/api/jobs", json={"recipe": "digits_cnn", "overrides": QUICK},
                          headers=CLIENT).status_code == 201
        (site / "attack.html").write_text(attack_page(server.url))
        httpd, _ = attacker_site(site)
        try:
            for url in (f"http://127.0.0.1:{httpd.server_address[1]}/attack.html", (site / "attack.html").as_uri()):
                browser.get(url)
                wait_for(lambda: browser.title == "done", 30, "the attack page to run")
                time.sleep(0.5)
                jobs = service.store.list()
                assert [(j.id, j.state) for j in jobs] == [(1, "queued")], url
        finally:
            httpd.shutdown()


@pytest.mark.slow
def test_the_dashboard_token_never_reaches_another_port(tmp_path, browser):
    from selenium.webdriver.common.by import By

    token = "dashboard-token-0123456789"
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>elsewhere</title>")
    httpd, seen = attacker_site(site)
    try:
        with LiveServer(make_service(tmp_path, "cpu:1"), token=token, manage_service=False) as server:
            browser.get(server.url + "/")
            wait_for(lambda: browser.find_element(By.ID, "login").is_displayed(), 30, "the token form")
            browser.find_element(By.ID, "token-input").send_keys(token)
            browser.find_element(By.ID, "login-submit").click()
            wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, '#recipe option[value="digits_cnn"]'), 30,
                     "the API to answer with the token")
            assert browser.execute_script("return document.cookie") == ""
            browser.get(f"http://127.0.0.1:{httpd.server_address[1]}/index.html")
            wait_for(lambda: browser.title == "elsewhere", 30, "the other port's page")
        assert seen, "the other port was not visited"
        for headers in seen:
            assert token not in str(headers) and "Cookie" not in headers and "cookie" not in headers
    finally:
        httpd.shutdown()


def test_a_job_logs_to_a_tracking_server_only_never_to_a_local_store(api):
    for mlflow in ("{}", "{tracking_uri: 'sqlite:////tmp/elsewhere.db'}", "{tracking_uri: 'file:///tmp/mlruns'}",
                   "{tracking_uri: /tmp/mlruns}"):
        refused(api.post("/api/jobs", json={"recipe": "digits_cnn", "overrides": [*QUICK, f"log.mlflow={mlflow}"]}),
                "log.mlflow.tracking_uri", "tracking server")
    assert api.get("/api/jobs").json() == []
