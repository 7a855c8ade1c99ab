"""`trainforge jobs ...` against a live server, and `trainforge server`'s refusals."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

import trainforge.cli
from jobs_helpers import QUICK, LiveServer, free_port, make_service, wait_for, with_steps


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        trainforge.cli.main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_submit_list_show_logs_cancel(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the server's directory; its job processes start in their job directories under it
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("# trainforge jobs submit mine.yaml\nname: mine\ndata:\n  source: digits\nmodel:\n  name: cnn\n")
    with LiveServer(make_service(tmp_path, "cpu:2")) as server:
        monkeypatch.setenv("TRAINFORGE_SERVER", server.url)
        code, out, err = cli(capsys, "jobs", "submit", str(recipe), *QUICK, "name=x$(touch${IFS}pwned);touch`pwned2`",
                             "--max-restarts", "1", "--priority", "2", "--json")
        assert code == 0, err
        job = json.loads(out)
        assert (job["id"], job["name"], job["state"], job["recipe"], job["priority"]) == \
            (1, "x$(touch${IFS}pwned);touch`pwned2`", "queued", "mine.yaml", 2)

        def state(job_id: int) -> str:
            code, out, _ = cli(capsys, "jobs", "list", "--json")
            assert code == 0
            return {j["id"]: j["state"] for j in json.loads(out)}[job_id]

        wait_for(lambda: state(1) in ("succeeded", "failed"), 120, "job 1 to finish", 0.5)
        code, out, _ = cli(capsys, "jobs", "list", "--json")
        rows = json.loads(out)
        assert rows == [{"id": 1, "name": job["name"], "state": "succeeded", "gpus": ["cpu0"], "restarts": 0,
                         "run_dir": str(server.service.state_dir / "jobs" / "1" / "run")}]
        assert not list(tmp_path.rglob("pwned*"))  # an injected command would have left a file somewhere here

        code, out, _ = cli(capsys, "jobs", "list")
        assert code == 0 and "succeeded" in out and "20/20" in out
        code, out, _ = cli(capsys, "jobs", "show", "1", "--json")
        shown = json.loads(out)
        assert shown["progress"]["step"] == 20 and "name: x$(touch${IFS}pwned)" in shown["config_yaml"]
        assert shown["memory_per"] == "slot"  # issue 55: CPU slots (--gpus cpu:2), not GPUs
        code, out, _ = cli(capsys, "jobs", "show", "1")
        assert code == 0 and "memory per slot" in out and "per GPU" not in out
        code, out, _ = cli(capsys, "jobs", "logs", "1", "--follow")  # returns: the job has ended
        assert code == 0 and "test accuracy" in out and "attempt 1 ended: succeeded" in out

        code, out, _ = cli(capsys, "jobs", "submit", "digits_cnn", *with_steps(100000))
        assert code == 0 and out.startswith("queued job 2 (digits_cnn)")
        wait_for(lambda: state(2) == "running", 60, "job 2 to start", 0.3)
        code, out, _ = cli(capsys, "jobs", "cancel", "2")
        assert code == 0 and "cancel requested" in out
        wait_for(lambda: state(2) == "cancelled", 60, "job 2 to be cancelled", 0.3)

        code, _, err = cli(capsys, "jobs", "show", "7")
        assert code == 2 and "job 7 does not exist" in err
        code, _, err = cli(capsys, "jobs", "submit", "digits_cnn", "optim.lr=fast")
        assert code == 2 and "optim.lr: expected a number, got 'fast'" in err
        code, _, err = cli(capsys, "jobs", "submit", "nosuch.yaml")
        assert code == 2 and "nosuch.yaml: recipe file not found" in err


def test_an_unreachable_server_is_one_line(capsys, monkeypatch):
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = cli(capsys, "jobs", "list", "--server", url)
    assert code == 2 and out == ""
    assert err.strip() == (f"error: cannot reach the trainforge server at {url}; start it with `trainforge server` "
                           "or pass --server")
    monkeypatch.setenv("TRAINFORGE_SERVER", url)
    code, _, err = cli(capsys, "jobs", "logs", "3")
    assert code == 2 and f"cannot reach the trainforge server at {url}" in err


def test_server_refuses_a_public_address_without_a_token(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("TRAINFORGE_TOKEN", raising=False)
    code, _, err = cli(capsys, "server", "--host", "0.0.0.0", "--state-dir", str(tmp_path / "s"), "--gpus", "cpu:1")
    assert code == 2 and "--host: 0.0.0.0" in err and "--token" in err
    assert not (tmp_path / "s").exists()  # refused before anything was created


def test_server_refuses_a_busy_port(capsys, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, _, err = cli(capsys, "server", "--port", str(port), "--state-dir", str(tmp_path / "s"), "--gpus", "cpu:1")
    assert code == 2 and f"--port: cannot listen on 127.0.0.1:{port}" in err


def test_server_refuses_an_unknown_placement_in_one_line(capsys, tmp_path):
    code, out, err = cli(capsys, "server", "--placement", "balance", "--state-dir", str(tmp_path / "s"),
                         "--gpus", "cpu:1")
    assert code == 2 and out == ""
    assert err.strip() == "error: --placement: expected spread or pack, got 'balance'"
    assert not (tmp_path / "s").exists()  # refused before anything was created


def served_by(capsys, monkeypatch, tmp_path, *argv: str):
    """The JobService `trainforge server ... ARGV` would serve (nothing listens), and its stderr."""
    import trainforge.jobs.server

    served = []
    monkeypatch.setattr(trainforge.jobs.server, "serve", lambda service, **kw: served.append(service))
    umask = os.umask(0o022)
    try:
        code, _, err = cli(capsys, "server", "--port", str(free_port()), "--state-dir", str(tmp_path / "s"),
                           "--gpus", "cpu:2", "--slot-memory-gb", "1", *argv)
    finally:
        os.umask(umask)  # the server sets 077 for its process: leave the test process as it was
    assert code == 0, err
    assert len(served) == 1
    return served[0], err


@pytest.mark.parametrize("argv, placement", [([], "spread"), (["--placement", "pack"], "pack"),
                                             (["--placement", "spread"], "spread")])
def test_server_placement_reaches_the_service(capsys, monkeypatch, tmp_path, argv, placement):
    service, err = served_by(capsys, monkeypatch, tmp_path, *argv)
    assert service.placement == placement
    assert f"placement: {placement}" in err


def test_the_commands_import_nothing_heavy():
    code = ("import sys, trainforge.jobs.commands\n"
            "heavy = [m for m in ('torch', 'fastapi', 'httpx', 'sqlalchemy', 'uvicorn') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


@pytest.mark.parametrize("argv, allowed", [([], False), (["--allow-hub-downloads"], True)])
def test_hub_downloads_are_off_unless_the_operator_allows_them(capsys, monkeypatch, tmp_path, argv, allowed):
    service, err = served_by(capsys, monkeypatch, tmp_path, *argv)
    assert service.allow_hub_downloads is allowed
    assert ("HF_HUB_OFFLINE" in service.checker.child_env) is not allowed
    assert f"hub downloads: {'allowed' if allowed else 'off'}" in err


def test_a_pretrained_path_the_server_may_not_read_is_exit_2(capsys, tmp_path):
    with LiveServer(make_service(tmp_path, "cpu:1"), manage_service=False) as server:
        code, out, err = cli(capsys, "jobs", "submit", "digits_cnn", "model.name=hf",
                             "model.args={pretrained: /home/alice/private-model}", "--server", server.url)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and "model.args.pretrained" in err and "--data-root" in err
        code, _, err = cli(capsys, "jobs", "submit", "digits_cnn", "model.name=hf",
                           "model.args={pretrained: no-such-org/no-such-model}", "--server", server.url)
        assert code == 2 and "not in this server's Hugging Face cache" in err and "--allow-hub-downloads" in err
