"""`trainforge runs list` and `trainforge runs compare` (issue 18): three real runs of the default recipe, made
tiny and trained once for this module, with three learning rates; the comparison page loaded in headless Chromium."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import trainforge
from chromium import CHROMIUM_MISSING
from trainforge import console
from trainforge.cli import main
from trainforge.training.loop import FitHooks

RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "digits_cnn.yaml")
TINY = ["train.max_steps=6", "train.eval_every_steps=2", "train.log_every_steps=2", "train.num_threads=1",
        "log.progress=false", "log.tensorboard=false", "log.report=false"]
LRS = ("0.001", "0.003", "0.01")
LIST_KEYS = ["name", "run_dir", "recipe", "status", "steps", "metric", "best_val", "best_val_step", "test",
             "started_at", "duration_s", "micro_batch_size", "device", "world_size"]
CHARTS = ("train-loss", "val-loss", "val-accuracy", "val-macro_f1")
HOUR_S = 3600.0
needs_chromium = pytest.mark.skipif(CHROMIUM_MISSING is not None, reason=CHROMIUM_MISSING or "")


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory) -> list[Path]:
    """runs/lr-0.001, lr-0.003, lr-0.01: the default recipe for 6 steps, evaluated at steps 2, 4 and 6."""
    root = tmp_path_factory.mktemp("runs")
    for lr in LRS:
        result = trainforge.train(RECIPE, overrides=[*TINY, f"optim.lr={lr}"], run_dir=root / f"lr-{lr}")
        assert result.status == "completed"
    return [root / f"lr-{lr}" for lr in LRS]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run that ended at its first evaluation (step 2) the way a pruned trial or a Ctrl-C does: a checkpoint
    was saved, no final model."""
    run_dir = tmp_path_factory.mktemp("stopped") / "stopped"
    result = trainforge.train(RECIPE, overrides=TINY, run_dir=run_dir, hooks=FitHooks(on_eval=lambda step, val: True))
    assert result.status == "pruned" and not (run_dir / "final").exists()
    return run_dir


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code or 0, captured.out, captured.err


def one_line_error(code: int, out: str, err: str, *words: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr naming what is wrong (each of `words`), no traceback."""
    assert code == 2 and out == "", (code, out, err)
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def age(run_dir: Path, seconds_ago: float) -> None:
    """Every file of a run as if written `seconds_ago` (a run's start and its latest write are read from mtimes)."""
    when = time.time() - seconds_ago
    for path in [run_dir, *run_dir.rglob("*")]:
        os.utime(path, (when, when), follow_symlinks=False)


def val_rows(run_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["split"] == "val"]


# ---------------------------------------------------------------- runs compare


@needs_chromium
def test_the_comparison_page_shows_three_curves_per_chart_and_only_the_lr_differs(three_runs, tmp_path, capsys,
                                                                                 browser):
    from selenium.webdriver.common.by import By

    out = tmp_path / "compare.html"
    code, stdout, err = cli(["runs", "compare", *map(str, three_runs), "--out", str(out), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    assert doc["out"] == str(out) and [r["label"] for r in doc["runs"]] == [d.name for d in three_runs]
    assert doc["config_differences"] == {"optim.lr": [0.001, 0.003, 0.01]}
    text = out.read_text()
    assert "<script" not in text and "<link" not in text and not re.search(r'(src|href)="(https?:)?//', text)

    browser.get(out.as_uri())
    names = [d.name for d in three_runs]
    for chart in CHARTS:
        figure = browser.find_element(By.ID, f"chart-{chart}")
        curves = figure.find_elements(By.CSS_SELECTOR, f'g[id^="curve-{chart}-"]')
        assert sorted(g.get_attribute("id") for g in curves) == [f"curve-{chart}-{i}" for i in range(3)], chart
        for g in curves:  # a drawn line: three points (steps 2, 4, 6), "M x y L x y L x y"
            assert g.find_element(By.TAG_NAME, "path").get_attribute("d").count("L") == 2, chart
        legend = [t.text for t in figure.find_elements(By.CSS_SELECTOR, "svg text")]
        assert all(name in legend for name in names), (chart, legend)

    rows = browser.find_elements(By.CSS_SELECTOR, "#config-differences tbody tr")
    assert [r.get_attribute("data-key") for r in rows] == ["optim.lr"]
    assert [td.text for td in rows[0].find_elements(By.TAG_NAME, "td")] == ["0.001", "0.003", "0.01"]
    header = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#config-differences thead th")]
    assert header == ["key", *names]

    accuracy = browser.find_element(By.CSS_SELECTOR, '#test-metrics tr[data-key="accuracy"]')
    tested = [json.loads((d / "eval.json").read_text())["accuracy"] for d in three_runs]
    assert [td.text for td in accuracy.find_elements(By.TAG_NAME, "td")] == [f"{a:.4g}" for a in tested]
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs-table tbody tr")
    statuses = [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows]
    assert statuses == ["completed"] * 3


def test_compare_refuses_bad_input_in_one_line(three_runs, tmp_path, capsys):
    a, b = map(str, three_runs[:2])
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not a run")
    out = tmp_path / "page.html"
    cases = [
        (["runs", "compare", a, "--out", str(out)], ["RUN_DIR", "2 to 10", "got 1"]),
        (["runs", "compare", "--out", str(out)], ["RUN_DIR", "got 0"]),
        (["runs", "compare", a, str(junk), "--out", str(out)], [str(junk), "not a run directory"]),
        (["runs", "compare", a, a + "/", "--out", str(out)], ["RUN_DIR", "same run"]),
        (["runs", "compare", a, b, "--out", str(junk / "notes.txt" / "page.html")], ["--out", "is a file"]),
        (["runs", "compare", a, b, "--out", str(tmp_path)], ["--out", "is a directory"]),
    ]
    for args, words in cases:
        one_line_error(*cli(args, capsys), *words)
    assert not out.exists()

    mine = tmp_path / "mine.html"
    mine.write_text("<p>my own notes</p>")
    one_line_error(*cli(["runs", "compare", a, b, "--out", str(mine)], capsys), "--out", "--force")
    assert mine.read_text() == "<p>my own notes</p>"
    assert cli(["runs", "compare", a, b, "--out", str(mine), "--force"], capsys)[0] == 0
    assert cli(["runs", "compare", b, a, "--out", str(mine)], capsys)[0] == 0  # its own page: replaced freely
    assert "trainforge comparison: lr-0.003, lr-0.001" in mine.read_text()
    deeper = tmp_path / "new" / "folder" / "page.html"  # folders are made, as --run-dir's are
    assert cli(["runs", "compare", a, b, "--out", str(deeper)], capsys)[0] == 0 and deeper.is_file()


def hostile_run(source: Path, parent: Path) -> Path:
    """A copy of a run whose directory name, config strings and eval.json keys are HTML that would run script; the
    name also starts with "_" (a label matplotlib's legend would drop) and holds "$\\bad$" (TeX it cannot draw)."""
    run = parent / "_<img src=x onerror=document.title='pwned'> $\\bad$"
    shutil.copytree(source, run)
    config = (run / "config.yaml").read_text().replace(
        "name: digits_cnn", "name: \"</title><script>document.title='pwned'</script>\"")
    config = config.replace("  args:\n", "  args:\n    note: \"<script>document.title='pwned'</script>\"\n", 1)
    (run / "config.yaml").write_text(config)
    result = json.loads((run / "eval.json").read_text())
    (run / "eval.json").write_text(json.dumps({**result, "<b onmouseover=alert(1)>x</b>": 1.0}))
    return run


def test_the_page_escapes_every_string_from_the_runs(three_runs, tmp_path, capsys):
    run = hostile_run(three_runs[0], tmp_path)
    out = tmp_path / "compare.html"
    code, _, err = cli(["runs", "compare", str(run), str(three_runs[1]), "--out", str(out)], capsys)
    assert code == 0, err
    text = out.read_text()
    assert "<script" not in text and "<img" not in text and "<b " not in text
    assert "&lt;img src=x onerror=document.title=&#x27;pwned&#x27;&gt;" in text  # the name, as text
    assert "model.args.note" in text and "&lt;/title&gt;&lt;script&gt;" in text


@needs_chromium
def test_a_hostile_run_runs_no_script_in_the_browser(three_runs, tmp_path, capsys, browser):
    from selenium.webdriver.common.by import By

    run = hostile_run(three_runs[0], tmp_path)
    out = tmp_path / "compare.html"
    assert cli(["runs", "compare", str(run), str(three_runs[1]), "--out", str(out)], capsys)[0] == 0
    browser.get(out.as_uri())
    assert browser.title == f"trainforge comparison: {run.name}, {three_runs[1].name}"  # as text; not set to 'pwned'
    assert browser.execute_script("return [document.scripts.length, document.images.length]") == [0, 0]
    first = browser.find_element(By.CSS_SELECTOR, "#runs-table tbody tr th").text
    assert first == run.name
    legend = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#chart-val-loss svg text")]
    assert run.name in legend


# ---------------------------------------------------------------- runs list


def test_runs_list_rows_statuses_order_and_json(three_runs, stopped_run, tmp_path, capsys, monkeypatch):
    root = tmp_path / "runs"
    root.mkdir()
    done = root / "done"
    shutil.copytree(three_runs[1], done)
    stopped = root / "stopped"
    shutil.copytree(stopped_run, stopped)
    trial = root / "trials" / "trial-0000"  # two levels down, as in `runs list studies/<study>`
    shutil.copytree(three_runs[2], trial)
    live = root / "live"  # a run that wrote a moment ago and has no final model yet
    shutil.copytree(three_runs[0], live)
    shutil.rmtree(live / "final")
    (live / "eval.json").unlink()
    shutil.copytree(three_runs[0], root / "junk" / "deeper" / "too-deep")  # three levels down: not searched
    (root / "junk" / "notes.txt").write_text("no config.yaml: not a run")
    (root / "broken").mkdir()
    (root / "broken" / "config.yaml").write_text("a: [unclosed\n")
    (root / "linked").symlink_to(three_runs[0], target_is_directory=True)  # leads out of DIR: not followed
    shutil.copytree(three_runs[0], trial / "nested")  # inside a run: never searched
    age(stopped, 3 * HOUR_S)
    age(done, 2 * HOUR_S)
    age(trial, 1 * HOUR_S)
    age(live, 0)

    code, stdout, err = cli(["runs", "list", str(root), "--json"], capsys)
    assert code == 0, err
    rows = json.loads(stdout)
    assert all(list(r) == LIST_KEYS for r in rows)
    assert [(r["name"], r["status"], r["steps"]) for r in rows] == [
        ("stopped", "stopped", 2), ("done", "completed", 6), ("trial-0000", "completed", 6), ("live", "running", 6)]
    assert [r["run_dir"] for r in rows] == [str(p) for p in (stopped, done, trial, live)]
    assert "broken" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1  # skipped, said once

    by_name = {r["name"]: r for r in rows}
    accuracies = [r["accuracy"] for r in val_rows(done)]
    assert by_name["done"]["metric"] == "accuracy"  # the recipe's train.early_stopping.metric
    assert by_name["done"]["best_val"] == max(accuracies)
    assert by_name["done"]["best_val_step"] == val_rows(done)[accuracies.index(max(accuracies))]["step"]
    assert by_name["done"]["test"] == json.loads((done / "eval.json").read_text())["accuracy"]
    assert [by_name["done"][k] for k in ("micro_batch_size", "device", "world_size")] == [64, "cpu", 1]
    assert by_name["stopped"]["test"] is None and by_name["stopped"]["best_val_step"] == 2
    assert by_name["stopped"]["started_at"] < by_name["done"]["started_at"] < by_name["trial-0000"]["started_at"]
    assert all(r["duration_s"] is not None and r["duration_s"] >= 0 for r in rows)

    age(live, 3 * HOUR_S)  # the same files, long silent: it stopped (with its checkpoint) rather than runs
    monkeypatch.setattr(console.out, "width", 200)
    code, stdout, _ = cli(["runs", "list", str(root)], capsys)
    assert code == 0
    table = [line.split("│") for line in stdout.splitlines() if line.startswith("│")]
    assert [(cells[1].strip(), cells[2].strip()) for cells in table] == [
        ("stopped", "stopped"), ("live", "stopped"), ("done", "completed"), ("trial-0000", "completed")]
    assert "best val accuracy" in stdout and f"{by_name['done']['best_val']:.4f} @6" in stdout


def test_runs_list_reads_a_failed_job_and_an_early_stop(three_runs, stopped_run, tmp_path, capsys):
    from trainforge.layout import JobDir

    job = JobDir(tmp_path / "jobs" / "7")
    shutil.copytree(stopped_run, job.run)
    job.recipe.write_text("name: digits_cnn\n")
    job.exit.write_text(json.dumps({"attempt": 1, "returncode": 1}))
    age(job.run, HOUR_S)
    early = tmp_path / "jobs" / "early"  # patience 1, and the kept (best) evaluation is not the last: stopped early
    shutil.copytree(three_runs[0], early)
    config = (early / "config.yaml").read_text().replace("patience: 10", "patience: 1")
    (early / "config.yaml").write_text(config)
    meta = json.loads((early / "final" / "model.json").read_text())
    (early / "final" / "model.json").write_text(json.dumps({**meta, "step": 4}))
    code, stdout, err = cli(["runs", "list", str(tmp_path / "jobs"), "--json"], capsys)
    assert code == 0, err
    assert {r["name"]: r["status"] for r in json.loads(stdout)} == {"run": "failed", "early": "early_stopped"}
    job.exit.write_text(json.dumps({"attempt": 1, "returncode": 0}))  # ended cleanly (cancelled): resumable
    rows = json.loads(cli(["runs", "list", str(job.path), "--json"], capsys)[1])
    assert [(r["name"], r["status"]) for r in rows] == [("run", "stopped")]


def test_runs_list_bad_input_and_nothing_found(tmp_path, capsys, monkeypatch):
    one_line_error(*cli(["runs", "list", str(tmp_path / "nope")], capsys), "DIR", "nope", "not a directory")
    (tmp_path / "file").write_text("x")
    one_line_error(*cli(["runs", "list", str(tmp_path / "file")], capsys), "DIR")
    monkeypatch.chdir(tmp_path)
    one_line_error(*cli(["runs", "list"], capsys), "DIR: runs", "default: runs")
    (tmp_path / "runs").mkdir()
    assert cli(["runs", "list", "--json"], capsys)[:2] == (0, "[]\n")
    code, stdout, err = cli(["runs", "list"], capsys)
    assert code == 0 and stdout == "" and "no runs under runs" in err


def test_the_commands_join_a_runs_group_another_stage_made():
    import typer

    from trainforge.report.commands import register

    app, group = typer.Typer(), typer.Typer()
    group.command("sync")(lambda: None)
    app.add_typer(group, name="runs")
    register(app)
    assert [g.name for g in app.registered_groups] == ["runs"]
    assert [c.name for c in group.registered_commands] == ["sync", "list", "compare", "report"]
    from trainforge.cli import app as trainforge_app  # and the real app has one group with the four

    groups = [g for g in trainforge_app.registered_groups if g.name == "runs"]
    assert len(groups) == 1
    assert sorted(c.name for c in groups[0].typer_instance.registered_commands) == ["compare", "list", "report", "sync"]


def test_listing_runs_loads_neither_torch_nor_matplotlib(three_runs):
    code = ("import sys; from trainforge.cli import main\n"
            f"try:\n    main(['runs', 'list', {str(three_runs[0].parent)!r}, '--json'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert [r["name"] for r in json.loads(proc.stdout)] == [d.name for d in three_runs]
