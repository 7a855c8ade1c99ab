"""Bad input never produces a traceback: exit code 2, one line naming the field or file and the fix,
and nothing the user had is touched."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainforge.cli import main

QUICK = ["train.max_steps=1", "log.progress=false", "log.tensorboard=false", "log.report=false"]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


CASES = {
    "unknown key": (["train", "train.bogus=1"], "train.bogus: unknown key"),
    "wrong type": (["train", "optim.lr=fast"], "optim.lr: expected a number, got 'fast'"),
    "negative batch size": (["train", "train.micro_batch_size=-4"], "train.micro_batch_size"),
    "missing recipe file": (["train", "recipes/nope.yaml"], "recipes/nope.yaml: recipe file not found"),
    "unknown model": (["train", "model.name=transformerxl"], "model.name: unknown model 'transformerxl'; choose one of: cnn,"),
    "unknown data source": (["train", "data.source=hdf5"], "data.source: unknown data source 'hdf5'; choose one of:"),
    "unknown optimizer": (["train", "optim.name=lamb"], "optim.name: unknown optimizer 'lamb'; choose one of: adamw, sgd"),
    "unknown schedule": (["train", "schedule.name=exp"], "schedule.name: unknown schedule 'exp'"),
    "bad model argument": (["train", "model.args={widht: 3}"], "model.args.widht"),
    "missing data path": (["train", "data.source=imagefolder", "data.path=/nonexistent/images"], "/nonexistent/images"),
    "batch larger than data": (["train", "train.global_batch_size=4096", "train.micro_batch_size=64"], "train.global_batch_size"),
    "device not present": (["train", "train.device=cuda:3"], "train.device"),
    "resume from nothing": (["train", "--resume", "/nonexistent/run"], "--resume: /nonexistent/run does not exist"),
    "eval of a non-checkpoint": (["eval", "/nonexistent/ckpt"], "/nonexistent/ckpt: no such checkpoint"),
    "bad override syntax": (["train", "optim.lr"], None),  # a lone word is taken as a recipe name
    # trainforge's own stages record stage.*; a recipe or an override never sets it (issue 39)
    "internal stage key": (["train", "digits_cnn", "stage.mlflow_parent_run_id=abc"],
                           "stage.mlflow_parent_run_id: set by trainforge's own stages"),
    "internal stage key, old spelling": (["train", "digits_cnn", "model.pruned=true"], "model.pruned: set by"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line(name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    args, expected = CASES[name]
    if args[0] == "train":
        args = [*args, *QUICK, "--run-dir", str(tmp_path / "run")]
    code, out, err = run_cli(args, capsys)
    assert code == 2, (code, err)
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    if expected:
        assert expected in lines[0], lines[0]
    assert not (tmp_path / "run").exists(), "a failed start must not leave a run directory behind"


def test_malformed_yaml_names_file_and_line(capsys, tmp_path):
    recipe = write(tmp_path / "bad.yaml", "# trainforge train bad.yaml\ntrain:\n  epochs: [1, 2\n")
    code, _, err = run_cli(["train", str(recipe), *QUICK], capsys)
    assert code == 2 and "bad.yaml: line" in err and "malformed YAML" in err


def test_unwritable_run_dir(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            # root ignores permission bits: a regular file where a directory must go fails for everyone
            target = write(tmp_path / "file", "x") / "run"
        else:
            target = locked / "run"
        code, _, err = run_cli(["train", *QUICK, "--run-dir", str(target)], capsys)
    finally:
        locked.chmod(0o700)
    assert code == 2 and "--run-dir" in err and "Traceback" not in err


def test_existing_run_is_not_overwritten(capsys, tmp_path):
    run = tmp_path / "run"
    write(run / "config.yaml", "name: precious\n")
    write(run / "metrics.jsonl", '{"split": "train", "step": 1}\n')
    code, _, err = run_cli(["train", *QUICK, "--run-dir", str(run)], capsys)
    assert code == 2 and "already holds a run; pass --resume auto" in err
    assert (run / "config.yaml").read_text() == "name: precious\n"
    assert (run / "metrics.jsonl").read_text() == '{"split": "train", "step": 1}\n'


def test_csv_with_a_text_feature_names_the_column(capsys, tmp_path):
    csv = write(tmp_path / "t.csv", "a,colour,label\n1.0,red,0\n2.0,blue,1\n")
    code, _, err = run_cli(["train", "data.source=csv", f"data.path={csv}", "model.name=mlp", *QUICK,
                            "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "colour" in err and "Traceback" not in err


def test_eval_bad_split(capsys, tmp_path):
    code, _, err = run_cli(["eval", str(tmp_path), "--split", "holdout"], capsys)
    assert code == 2 and "--split" in err


def test_real_process_prints_no_traceback(tmp_path):
    """The installed console script, not just main(): exit 2 and a single line on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", "optim.lr=fast"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: optim.lr: expected a number, got 'fast'"


def test_a_diverging_run_exits_1_with_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "training"))
    code, _, err = run_cli([
        "train", "model.name=custom", "model.target=loop_models:nan_on_calls", "model.args={bad_calls: [1, 2, 3, 4, 5]}",
        "train.max_steps=10", "train.max_bad_steps=3", "log.progress=false", "log.tensorboard=false", "log.report=false",
        "--run-dir", str(tmp_path / "run"),
    ], capsys)
    assert code == 1
    assert "Traceback" not in err
    last = [line for line in err.strip().splitlines() if line.strip()][-1]
    assert last.startswith("failed: 3 non-finite losses in a row at step 3")
