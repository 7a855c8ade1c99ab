"""A user's typo is answered at once (issue 27, item 7): a bad key, a wrong type or a missing file is refused with one
line and exit 2 by every command before torch (or optuna, transformers) is imported; `--help` and `recipes` import
none of them either. Measured, not timed here: importing torch is what made such an answer take seconds."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import trainforge

SRC = str(Path(trainforge.__file__).resolve().parents[1])
HEAVY = ("torch", "optuna", "transformers", "onnxruntime", "matplotlib")
PROBE = ("import atexit, sys\n"
         f"atexit.register(lambda: print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr))\n"
         "from trainforge.cli import main\n"
         "main(sys.argv[1:])\n")


def run_cli(*argv: str, cwd: Path) -> tuple[int, str, list[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=cwd, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC, "HOME": str(cwd)})
    lines = out.stderr.strip().splitlines()
    loaded = eval(lines[-1].removeprefix("LOADED ")) if lines and lines[-1].startswith("LOADED") else None
    return out.returncode, "\n".join(lines[:-1]), loaded


BAD = [
    (["train", "optim.lrr=1"], "optim.lrr"),
    (["train", "train.epochs=many"], "train.epochs"),
    (["train", "no-such-recipe.yaml"], "no-such-recipe.yaml"),
    (["plan", "optim.lrr=1"], "optim.lrr"),
    (["tune", "digits_cnn", "optim.lrr=1", "--space", "space.yaml", "--trials", "1"], "optim.lrr"),
    (["tune", "digits_cnn", "--space", "no-such-space.yaml", "--trials", "1"], "--space"),
    (["data", "prepare", "charlm_gpt", "optim.lrr=1"], "optim.lrr"),
    (["launch", "slurm", "digits_cnn", "optim.lrr=1"], "optim.lrr"),
    (["eval", "no/such/run"], "no/such/run: no such checkpoint or run directory"),
    (["compress", "no/such/run"], "no/such/run: no such checkpoint or run directory"),
    (["generate", "no/such/run", "hello"], "no/such/run: no such checkpoint or run directory"),
]


@pytest.mark.parametrize("argv, field", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_input_is_one_line_before_anything_heavy_is_imported(tmp_path, argv, field):
    (tmp_path / "space.yaml").write_text("optim.lr: {type: float, low: 0.001, high: 0.1, log: true}\n")
    code, err, loaded = run_cli(*argv, cwd=tmp_path)
    assert code == 2, err
    assert err.count("\n") == 0 and err.startswith("error: ") and field in err, err
    assert loaded == [], f"{loaded} imported before the answer"


@pytest.mark.parametrize("argv", [["--help"], ["recipes"], ["train", "--help"]])
def test_help_and_the_recipe_list_import_nothing_heavy(tmp_path, argv):
    code, err, loaded = run_cli(*argv, cwd=tmp_path)
    assert code == 0, err
    assert loaded == [], loaded


def test_the_light_checks_know_the_same_names_as_the_heavy_code():
    from trainforge.compression.options import INT8_METHOD_NAMES
    from trainforge.compression.quantize import INT8_METHODS

    assert set(INT8_METHOD_NAMES) == {"auto", *INT8_METHODS.names()}
