"""Values made to break the job server (finding 4 of the security review): NUL bytes, control characters, DEL
and lone surrogates in a submission, integers past Python's int-string limit, impossible dates, terminal escape
sequences in a job's name, its output and the server's log, and a train.freeze pattern that matches nothing.
Each is performed through the API (or the CLI against a live server): a 400 with one line naming the field, and
whatever is shown shows the characters as escapes."""
from __future__ import annotations

import io
import json
import subprocess
import warnings

import pytest

with warnings.catch_warnings():  # starlette's note about its httpx-based TestClient is not ours to fix
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

import trainforge.cli
import trainforge.console
from jobs_helpers import QUICK, LiveServer, make_service
from trainforge.confine import ENV as ROOTS_ENV
from trainforge.confine import confine, local_path
from trainforge.errors import UserError
from trainforge.jobs.server import create_app
from trainforge.jobs.serverlog import log_to

CLIENT = {"X-Trainforge-Client": "test", "Content-Type": "application/json"}
DIGITS = "5" * 5000  # past Python's 4300-digit limit of int(str)


@pytest.fixture
def api(tmp_path, data_root):
    with TestClient(create_app(make_service(tmp_path, data_roots=[data_root]), manage_service=False),
                    headers=CLIENT) as c:
        yield c


def post(api, body: dict):
    # json.dumps writes a lone surrogate as the escape "\ud800" (valid JSON, as any client may send it)
    return api.post("/api/jobs", content=json.dumps(body))


def refused(r, *words: str) -> str:
    assert r.status_code == 400, (r.status_code, r.text[:500])
    detail = r.json()["detail"]
    assert "\n" not in detail and len(detail) < 1000, detail
    assert not any(c in detail for c in "\x00\x1b\x7f\x9b"), detail  # quoted as escapes, never raw
    for w in words:
        assert w in detail, detail
    return detail


def override(*items: str) -> dict:
    return {"recipe": "digits_cnn", "overrides": [*QUICK, *items]}


def text(yaml_text: str) -> dict:
    return {"recipe": "mine.yaml", "recipe_yaml": yaml_text}


CASES = {  # name -> (body, words the one line holds); each was a 500 with a traceback in the server's log
    "NUL in data.path (override)": (
        lambda root: override("data.source=csv", f"data.path={root}/a\0b.csv"), ["data.path", "'\\x00'"]),
    "NUL in data.path (YAML escape)": (
        lambda root: text(f'data:\n  source: csv\n  path: "{root}/a\\0b.csv"\n'), ["data.path", "'\\x00'"]),
    "NUL in an override": (lambda root: override("model.args.x=a\0b"), ["model.args.x", "'\\x00'"]),
    "control character in recipe_yaml": (lambda root: text("name: a\x01b\n"), ["mine.yaml", "'\\x01'"]),
    "ESC in recipe_yaml, line 3": (lambda root: text("seed: 1\ntrain:\n  epochs: 1\x1b\n"),
                                   ["mine.yaml: line 3", "'\\x1b'"]),
    "DEL in recipe_yaml": (lambda root: text("name: a\x7fb\n"), ["mine.yaml", "'\\x7f'"]),
    "ESC as a YAML escape": (lambda root: text('model:\n  args:\n    x: "\\e[2J"\n'), ["model.args.x", "'\\x1b'"]),
    "ESC in a key (YAML escape)": (lambda root: text('model:\n  args:\n    "k\\x1b": 1\n'),
                                   ["model.args: the key", "'\\x1b'"]),
    "C1 CSI in an override": (lambda root: override("model.args.x=a\x9b2J"), ["model.args.x", "'\\x9b'"]),
    "DEL in an override key": (lambda root: override("train.epochs\x7f=1"), ["train.epochs", "'\\x7f'", "key"]),
    "separator the key's strip() would drop": (lambda root: override("\x1ctrain.epochs=1"), ["'\\x1c'", "key"]),
    "lone surrogate in recipe_yaml": (lambda root: text("seed: 1\nname: a\ud800b\n"),
                                      ["recipe_yaml: line 2", "lone surrogate"]),
    "lone surrogate in an override": (lambda root: override("model.args.x=a\udfffb"), ["model.args.x", "lone surrogate"]),
    "lone surrogate in an override key": (lambda root: override("a\ud800=1"), ["lone surrogate", "key"]),
    "control character in the recipe's name": (lambda root: {"recipe": "a\x1b[2Jb", "recipe_yaml": "name: x\n"},
                                               ["recipe", "'\\x1b'"]),
    "5000-digit integer in YAML": (lambda root: text(f"seed: {DIGITS}\n"), ["mine.yaml", "an integer of 5000 digits"]),
    "5000-digit integer, line 2": (lambda root: text(f"name: x\nseed: {DIGITS}\n"), ["mine.yaml: line 2", "5000 digits"]),
    "5000-digit integer override": (lambda root: override(f"seed={DIGITS}"), ["seed: an integer of 5000 digits"]),
    "5000-digit integer in model.args": (lambda root: override(f"model.args.width={DIGITS}"),
                                         ["model.args.width: an integer of 5000 digits"]),
    "impossible date in YAML": (lambda root: text("name: 2024-13-45\n"),
                                ["mine.yaml", "'2024-13-45' is not a valid timestamp"]),
    "!!timestamp that is no date": (lambda root: text("model:\n  args:\n    x: !!timestamp foo\n"),
                                    ["mine.yaml: line 3", "'foo' is not a valid timestamp"]),
    "impossible date override": (lambda root: override("model.args.x=2024-02-30"),
                                 ["model.args.x: '2024-02-30' is not a valid timestamp"]),
    "!!int that is no integer": (lambda root: text("seed: !!int abc\n"), ["mine.yaml", "'abc' is not a valid int"]),
    "!!bool that is no boolean": (lambda root: text("train:\n  compile: !!bool maybe\n"),
                                  ["mine.yaml: line 2", "'maybe' is not a valid bool"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_values_are_400_with_one_line_naming_the_field(api, data_root, name):
    make_body, words = CASES[name]
    refused(post(api, make_body(data_root)), *words)
    assert api.get("/api/jobs").json() == []


def test_a_path_with_a_nul_byte_is_refused_where_paths_are_confined(data_root, monkeypatch):
    """Behind the config check: the job process confines every path it opens (os.path raises ValueError on NUL)."""
    monkeypatch.setenv(ROOTS_ENV, str(data_root))
    for check in (lambda: confine(f"{data_root}/a\0b", "data.path", [data_root]),
                  lambda: local_path(f"{data_root}/model\0", "model.args.pretrained")):
        with pytest.raises(UserError, match=r"^(data.path|model.args.pretrained): '.*\\x00.*' holds a NUL byte"):
            check()


NAMES = {  # a job's name is shown in tables, logs and folder names: no control or invisible character at all
    "ESC sequences (clear screen, colours)": "evil\x1b[2J\x1b[31m",
    "OSC title and BEL": "x\x1b]0;pwned\x07",
    "tab": "a\tb",
    "newline": "a\nb",
    "carriage return": "a\rb",
    "right-to-left override": "txt.\u202eexe",
    "zero-width space": "a\u200bb",
    "C1 CSI": "a\x9b2J",
}


@pytest.mark.parametrize("label, how", [
    (label, how) for label in sorted(NAMES) for how in ("override", "quoted override", "recipe_yaml")
    if not (how == "override" and label in ("newline", "carriage return"))])  # YAML folds those: the next test
def test_names_with_control_characters_are_refused(api, label, how):
    name = NAMES[label]
    body = {"override": override(f"name={name}"), "quoted override": override(f"name={json.dumps(name)}"),
            "recipe_yaml": text(f"name: {json.dumps(name)}\n")}[how]
    refused(post(api, body), "name:")
    assert api.get("/api/jobs").json() == []


def test_a_plain_name_with_spaces_and_unicode_is_accepted(api):
    r = post(api, override("name=Zoë's run №2"))
    assert r.status_code == 201 and r.json()["name"] == "Zoë's run №2", r.text
    r = post(api, override("name=a\r\nb"))  # a plain YAML value: the line break is folded into a space
    assert r.status_code == 201 and r.json()["name"] == "a b", r.text


@pytest.mark.parametrize("patterns, words", [
    ("[nomatch*]", ["train.freeze[0]: 'nomatch*' matches no parameter of this model", "features."]),
    ("['re:(']", ["train.freeze[0]: 're:(' is not a regular expression"]),
    ("['*']", ["train.freeze: every parameter is frozen"]),
])
def test_a_freeze_pattern_error_says_what_is_wrong_with_train_freeze(api, patterns, words):
    """Found in the capped check (the model is built there): the line is public, it holds only the submitter's
    own pattern and the built-in model's parameter names."""
    detail = refused(post(api, override(f"train.freeze={patterns}")), *words)
    assert "cannot be used as given" not in detail and "failed" not in detail


def test_a_param_group_that_matches_nothing_is_named(api):
    refused(post(api, override("optim.param_groups=[{match: zzz, lr: 0.1}]")),
            "optim.param_groups[0].match: 'zzz' matches no parameter")


# ---------------------------------------------------------------- escaped wherever echoed


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        trainforge.cli.main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_job_from_before_names_were_checked_is_shown_escaped(tmp_path, capsys, monkeypatch):
    """A job in the database with an ESC in its name, and whose output ended in colour codes: `jobs list`,
    `jobs show` and `jobs logs` show the escapes as text, and the server's log line for it does too."""
    service = make_service(tmp_path)
    evil = "evil\x1b[2J\x1b]0;pwned\x07"
    job = service.store.create(
        job_dir_for=lambda i: str(service.paths(i).path), name=evil, recipe="digits_cnn",
        overrides=[f"name={evil}"], config_yaml="name: old\n", num_gpus=1, priority=0, max_restarts=0,
        memory_bytes=2**20, total_steps=10)
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert service.store.claim(job.id, ["cpu0"]) and service.store.set_process(job.id, gone.pid, None)
    log_file = service.paths(job.id).log
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text("step\t1\r\n\x1b[31mdata error in row 3\x1b[0m\x00\n")

    stream = io.StringIO()
    with log_to(stream):  # as `trainforge server` logs
        service.reconcile()  # the process is gone: the job fails with its last log line as the reason
    server_log = stream.getvalue()
    assert "job 1 failed" in server_log and "\\x1b[31mdata error in row 3\\x1b[0m\\x00" in server_log, server_log
    assert not any(c in server_log for c in "\x00\x1b\x07"), repr(server_log)

    monkeypatch.setattr(trainforge.console.out, "width", 200)  # table cells on one line each
    with LiveServer(service, manage_service=False) as server:
        code, listed, _ = cli(capsys, "jobs", "list", "--server", server.url)
        assert code == 0 and "evil\\x1b[2J\\x1b]0;pwned\\x07" in listed, listed
        code, shown, _ = cli(capsys, "jobs", "show", "1", "--server", server.url)
        assert code == 0 and "evil\\x1b[2J" in shown and "\\x1b[31mdata" in " ".join(shown.split()), shown
        code, logs, _ = cli(capsys, "jobs", "logs", "1", "--server", server.url)
        assert code == 0 and "step\t1\n\\x1b[31mdata error in row 3\\x1b[0m\\x00\n" in logs, repr(logs)
        code, as_json, _ = cli(capsys, "jobs", "list", "--json", "--server", server.url)
        assert code == 0 and json.loads(as_json)[0]["name"] == evil  # the JSON contract carries the data itself
    for output in (listed, shown, logs, as_json):
        assert not any(c in output for c in "\x00\x1b\x07\r"), repr(output)
