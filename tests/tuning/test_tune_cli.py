"""`trainforge tune` bad input: exit 2 with one line naming the flag, file or key; nothing is created."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import trainforge
from trainforge.cli import main
from trainforge.errors import UserError

SPACE = "optim.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}\n"

CASES = {
    "missing space file": (["--space", "{tmp}/nope.yaml", "--trials", "2"], "--space: {tmp}/nope.yaml does not exist"),
    "malformed space": (["--space", "{tmp}/bad.yaml", "--trials", "2"], "{tmp}/bad.yaml: line 3 malformed YAML"),
    "unknown key in space": (["--space", "{tmp}/badkey.yaml", "--trials", "2"], "{tmp}/badkey.yaml: optim.lrr: unknown config key"),
    "no trials": (["--space", "{tmp}/space.yaml", "--trials", "0"], "--trials: must be at least 1, got 0"),
    "no workers": (["--space", "{tmp}/space.yaml", "--trials", "2", "--parallel", "0"], "--parallel: must be at least 1"),
    "unknown pruner": (["--space", "{tmp}/space.yaml", "--trials", "2", "--pruner", "asha"],
                       "--pruner: unknown pruner 'asha'; choose one of: hyperband, median, none"),
    "unknown metric": (["--space", "{tmp}/space.yaml", "--trials", "2", "--metric", "perplexity"],
                       "--metric: 'perplexity' is not reported for classification; choose one of loss, accuracy, macro_f1"),
    "unknown direction": (["--space", "{tmp}/space.yaml", "--trials", "2", "--direction", "up"],
                          "--direction: must be maximize or minimize, got 'up'"),
    "unparsable storage": (["--space", "{tmp}/space.yaml", "--trials", "2", "--storage", "db at home"],
                           "--storage: cannot parse 'db at home' as a SQLAlchemy URL"),
    "unreachable storage": (["--space", "{tmp}/space.yaml", "--trials", "2", "--storage",
                             "postgresql+psycopg://me:secret@127.0.0.1:1/db"], "--storage: cannot open postgresql+psycopg://me:***@"),
    "bad recipe override": (["train.bogus=1", "--space", "{tmp}/space.yaml", "--trials", "2"], "train.bogus: unknown key"),
    "study name with a slash": (["--space", "{tmp}/space.yaml", "--trials", "2", "--study", "a/b"],
                                "--study: 'a/b' cannot name a folder"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_with_one_line(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(SPACE)
    (tmp_path / "bad.yaml").write_text("optim.lr: {type: float,\n  low: [\n")
    (tmp_path / "badkey.yaml").write_text("optim.lrr: {type: float, low: 0.1, high: 0.2}\n")
    args, expected = CASES[name]
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    with pytest.raises(SystemExit) as e:
        main(["tune", "digits_cnn", *args])
    captured = capsys.readouterr()
    assert e.value.code == 2, captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert expected.replace("{tmp}", str(tmp_path)) in " ".join(captured.err.split()), captured.err
    assert captured.out == ""
    assert not (tmp_path / "studies").exists()


def test_the_api_raises_the_same_errors(tmp_path):
    (tmp_path / "space.yaml").write_text(SPACE)
    with pytest.raises(UserError, match="--trials: must be at least 1"):
        trainforge.tune("digits_cnn", tmp_path / "space.yaml", trials=0)
    importlib.import_module("trainforge.tuning.api")  # the package (tuning) never replaces the function (tune)

    with pytest.raises(UserError, match="--parallel: must be at least 1"):
        trainforge.tune("digits_cnn", tmp_path / "space.yaml", trials=1, parallel=0)


def test_help_lists_tune_without_importing_torch():
    code = ("import sys; from trainforge.cli import main\n"
            "try:\n    main(['tune', '--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'optuna' not in sys.modules, 'heavy import'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--space", "--trials", "--parallel", "--storage", "--study", "--pruner", "--metric", "--direction",
                 "--out", "--json"):
        assert flag in proc.stdout


def test_a_language_model_is_tuned_on_loss_or_perplexity(tmp_path, capsys):
    (tmp_path / "space.yaml").write_text(SPACE)
    with pytest.raises(SystemExit) as e:
        main(["tune", "gpt2_small_synthetic", "data.args.num_samples=64", "data.args.seq_len=16",
              "--space", str(tmp_path / "space.yaml"), "--trials", "1", "--metric", "accuracy", "--out", str(tmp_path / "s")])
    assert e.value.code == 2
    assert "--metric: 'accuracy' is not reported for lm; choose one of loss, perplexity" in capsys.readouterr().err
