"""Input made to hurt (an alias bomb, deep nesting, bytes that are not text, absurd numbers) gets the same
treatment as any mistake: exit 2, one short line naming the file or field, nothing written."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

import trainforge
import trainforge.training.api  # noqa: F401  (imported here: the timings below are of the checks, not of torch's import)
from trainforge.cli import main
from trainforge.integrity import write_manifest

QUICK = ["train.max_steps=1", "log.progress=false", "log.tensorboard=false", "log.report=false"]
# 536 bytes; fully expanded it is 9^12 values (the 72 MB error message of the security review, and more)
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"l{i}: &l{i} [" + ",".join([f"*{'a' if i == 1 else f'l{i - 1}'}"] * 9) + "]\n" for i in range(1, 12))


def run_cli(args: list[str], capsys) -> tuple[int, str, float]:
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr().err, time.monotonic() - t0


RECIPES = {  # file content -> what the one line says
    "alias bomb": (BOMB.encode(), "expands to more than"),
    "deep nesting": (("model:\n  args:\n    x: " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nested deeper than"),
    "not UTF-8": (b"name: caf\xe9\n", "not UTF-8 text"),
    "empty": (b"", "empty; a recipe must be a YAML mapping"),
    "only a comment": (b"# trainforge train x.yaml\n", "empty; a recipe must be a YAML mapping"),
    "duplicate key": (b"name: a\ntrain:\n  epochs: 1\ntrain:\n  epochs: 2\n", "line 4: key 'train' appears twice"),
    "larger than 1 MiB": (b"name: x\n# " + b"x" * (1 << 20) + b"\n", "larger than 1024 KiB"),
    "recursive alias": (b"a: &a [*a]\n", "alias contains itself"),
}


@pytest.mark.serial  # a timing bar: measured with the machine to itself
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_hostile_recipe_files_are_one_short_line(name, tmp_path, capsys):
    content, expected = RECIPES[name]
    recipe = tmp_path / "x.yaml"
    recipe.write_bytes(content)
    code, err, seconds = run_cli(["train", str(recipe), *QUICK, "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and seconds < 1.0, (code, seconds)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and len(err) < 2000 and "Traceback" not in err, err[:3000]
    assert lines[0].startswith(f"error: {recipe}") and expected in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


OVERRIDES = {
    "infinite lr": (["optim.lr=.inf"], "optim.lr: expected a finite number"),
    "nan lr": (["optim.lr=.nan"], "optim.lr: expected a finite number"),
    "zero lr": (["optim.lr=0"], "optim.lr: input should be greater than 0"),
    "negative lr": (["optim.lr=-1e-3"], "optim.lr: input should be greater than 0"),
    "max_steps 1e23": (["train.max_steps=1e23"], "train.max_steps"),
    "max_steps above 10^12": (["train.max_steps=1000000000001"], "train.max_steps: input should be less than"),
    "int64 overflow": (["train.max_steps=99999999999999999999999"], "train.max_steps"),
    "seed beyond int64": ([f"seed={2**64}"], "seed: input should be less than"),
    "nested override value": (["model.args.x=" + "[" * 3000 + "]" * 3000], "model.args.x: nested deeper than"),
    "deep override key": (["a." * 3000 + "b=1"], "more than 64 key segments"),
    "alias bomb override": (["model.args=" + BOMB.replace("\n", ", ").join("{}")], "expands to more than"),
    "name too long": (["name=" + "n" * 300], "name: must be a plain name"),
    "torchvision kwargs the dataset cannot use": (
        ["data.source=torchvision", "data.args={name: FakeData, kwargs: {size: 8, image_size: x}}", "model.name=mlp",
         "model.args={}"], "data.args.kwargs: FakeData cannot read its samples"),
    "torchvision kwargs trainforge sets": (
        ["data.source=torchvision", "data.args={name: FakeData, kwargs: {transform: 3}}"], "data.args.kwargs.transform"),
}


@pytest.mark.parametrize("name", sorted(OVERRIDES))
def test_absurd_values_are_one_short_line(name, tmp_path, capsys):
    overrides, expected = OVERRIDES[name]
    code, err, _ = run_cli(["train", *QUICK, *overrides, "--run-dir", str(tmp_path / "run")], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and len(err) < 2000, err[:3000]
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.serial  # a timing bar: measured with the machine to itself
def test_a_recipe_given_as_a_device_is_not_read_forever(tmp_path, capsys):
    code, err, seconds = run_cli(["train", "/dev/zero", *QUICK, "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 2 and seconds < 5 and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- control characters, huge integers, bad dates

DIGITS = "5" * 5000  # past Python's 4300-digit limit of int(str)
HIDDEN = ("\x00", "\x1b", "\x07", "\x7f", "\x9b")


def one_clean_line(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[:3000]
    assert not any(c in err for c in HIDDEN), repr(err)  # a control character is shown as its escape, never sent
    return lines[0]


VALUES = {  # recipe file content -> what the one line says (each was a traceback)
    "ESC in the text": (b"name: a\x1b[2Jb\n", "{recipe}: a control character ('\\x1b') in the text"),
    "NUL in the text, line 2": (b"seed: 1\nname: a\x00b\n", "{recipe}: line 2: a control character ('\\x00')"),
    "DEL in the text": (b"name: a\x7fb\n", "{recipe}: a control character ('\\x7f')"),
    "ESC as a YAML escape": (b'name: "a\\e[2Jb"\n', "name: a control character ('\\x1b') in the value"),
    "NUL in data.path as a YAML escape": (b'data:\n  source: csv\n  path: "/data/a\\0b.csv"\n',
                                          "data.path: a control character ('\\x00') in the value"),
    "C1 CSI in a key": (b'model:\n  args:\n    "k\\x9b": 1\n', "model.args: the key 'k\\x9b' holds a control character"),
    "tab in the name": (b'name: "a\\tb"\n', "name: a control character ('\\t') in the name"),
    "5000-digit integer": (f"seed: {DIGITS}\n".encode(), "{recipe}: an integer of 5000 digits"),
    "impossible date": (b"seed: 1\nname: 2024-13-45\n", "{recipe}: line 2: '2024-13-45' is not a valid timestamp"),
    "!!timestamp that is no date": (b"model:\n  args:\n    x: !!timestamp foo\n",
                                    "{recipe}: line 3: 'foo' is not a valid timestamp"),
}


@pytest.mark.parametrize("name", sorted(VALUES))
def test_hostile_values_in_a_recipe_are_one_line_naming_the_field(name, tmp_path, capsys):
    content, expected = VALUES[name]
    recipe = tmp_path / "x.yaml"
    recipe.write_bytes(content)
    code, err, _ = run_cli(["train", str(recipe), *QUICK, "--run-dir", str(tmp_path / "run")], capsys)
    assert expected.format(recipe=recipe) in one_clean_line(code, err)
    assert not (tmp_path / "run").exists()


HOSTILE_OVERRIDES = {
    "ESC in the name": (["name=evil\x1b[2J\x1b[31m"], "name: a control character ('\\x1b') in the value"),
    "NUL in data.path": (["data.source=csv", "data.path=/data/a\0b.csv"], "data.path: a control character ('\\x00')"),
    "DEL in a key": (["train.epochs\x7f=1"], "'train.epochs\\x7f': a control character ('\\x7f') in the key"),
    "lone surrogate": (["model.args.x=a\udc80"], "model.args.x: a lone surrogate ('\\udc80'"),
    "right-to-left override in the name": (["name=txt.\u202eexe"], "name: an invisible character ('\\u202e')"),
    "5000-digit integer": ([f"seed={DIGITS}"], "seed: an integer of 5000 digits"),
    "5000-digit hex integer in model.args": ([f"model.args.width=0x{'f' * 5000}"], "model.args.width: an integer of"),
    "impossible date": (["model.args.x=2024-02-30"], "model.args.x: '2024-02-30' is not a valid timestamp"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_OVERRIDES))
def test_hostile_override_values_are_one_line_naming_the_field(name, tmp_path, capsys):
    overrides, expected = HOSTILE_OVERRIDES[name]
    code, err, _ = run_cli(["train", *QUICK, *overrides, "--run-dir", str(tmp_path / "run")], capsys)
    assert expected in one_clean_line(code, err)
    assert not (tmp_path / "run").exists()


def test_an_error_naming_a_path_with_an_escape_shows_it_escaped(tmp_path, capsys):
    recipe = f"{tmp_path}/clear\x1b[2J.yaml"
    code, err, _ = run_cli(["train", recipe, *QUICK], capsys)
    assert f"{tmp_path}/clear\\x1b[2J.yaml: recipe file not found" in one_clean_line(code, err)


# ---------------------------------------------------------------- numeric options: nan, inf, negative, zero

OPTIONS = {
    "plan --budget-usd nan": (["plan", "--gpu", "h100-sxm", "--budget-usd", "nan"], "--budget-usd: expected a positive"),
    "plan --budget-usd inf": (["plan", "--gpu", "h100-sxm", "--budget-usd", "inf"], "--budget-usd: expected a positive"),
    "plan --budget-usd 0": (["plan", "--gpu", "h100-sxm", "--budget-usd", "0"], "--budget-usd: expected a positive"),
    "plan --deadline-h -1": (["plan", "--gpu", "h100-sxm", "--deadline-h", "-1"], "--deadline-h: expected a positive"),
    "plan --deadline-h nan": (["plan", "--gpu", "h100-sxm", "--deadline-h", "nan"], "--deadline-h: expected a positive"),
    "compress --bench-seconds -1": (["compress", "{run}", "--bench-seconds", "-1"], "--bench-seconds: expected seconds"),
    "compress --bench-seconds 0": (["compress", "{run}", "--bench-seconds", "0"], "--bench-seconds: expected seconds"),
    "compress --bench-seconds nan": (["compress", "{run}", "--bench-seconds", "nan"], "--bench-seconds: expected seconds"),
    "compress --bench-seconds inf": (["compress", "{run}", "--bench-seconds", "inf"], "--bench-seconds: expected seconds"),
    "compress --temperature nan": (["compress", "{run}", "--temperature", "nan"], "--temperature must be a finite number"),
    "compress --calibration-samples 0": (["compress", "{run}", "--calibration-samples", "0"],
                                         "--calibration-samples: expected 1 to"),
    "compress --threads 10^9": (["compress", "{run}", "--threads", "1000000000"], "--threads: expected 1 to"),
    "generate --temperature inf": (["generate", "{run}", "hi", "--temperature", "inf"],
                                   "--temperature: must be >= 0 and finite"),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_meaningless_numbers_in_options_are_one_line(name, tmp_path, capsys):
    """Checked before anything is loaded: the run directory need not even exist."""
    args, expected = OPTIONS[name]
    code, err, _ = run_cli([a.format(run=tmp_path / "run") for a in args], capsys)
    assert one_clean_line(code, err).startswith(f"error: {expected}"), err


# ---------------------------------------------------------------- a final/model.json that lies


@pytest.fixture(scope="module")
def final_dir(tmp_path_factory) -> Path:
    """A tiny run's final/ (one step of a small MLP on digits), built once; each test corrupts a copy."""
    run_dir = tmp_path_factory.mktemp("hostile-eval") / "run"
    trainforge.train(None, overrides=[*QUICK, "train.early_stopping=null", "model.name=mlp", "model.args={hidden: [8]}",
                                      "data.num_workers=0"], run_dir=run_dir)
    return run_dir / "final"


def corrupted(final_dir: Path, tmp_path: Path, edit) -> Path:
    """A copy of final/ whose model.json `edit` changed, with its manifest rewritten to match (as a tool that edits
    the file, or a run written wrong, leaves it): the SHA-256 check passes, the fields must be checked themselves."""
    final = tmp_path / "final"
    shutil.copytree(final_dir, final)
    meta = json.loads((final / "model.json").read_text())
    edit(meta)
    (final / "model.json").write_text(json.dumps(meta))
    write_manifest(final)
    return final


MODEL_JSON = {  # each was a traceback from deep in torch (or the allocator)
    "input_shape 1e30": (lambda m: m["data_info"].update(input_shape=[1e30, 8, 8]),
                         "data_info.input_shape[0]: expected an integer in 1..16777216, got 1e+30"),
    "input_shape negative": (lambda m: m["data_info"].update(input_shape=[1, -8, 8]),
                             "data_info.input_shape[1]: expected an integer in 1..16777216, got -8"),
    "input_shape a string": (lambda m: m["data_info"].update(input_shape="8x8"),
                             "data_info.input_shape: expected a list of 1 to 4 sizes, got '8x8'"),
    "num_classes 'ten'": (lambda m: m["data_info"].update(num_classes="ten"),
                          "data_info.num_classes: expected an integer in 1..16777216, got 'ten'"),
    "num_classes 10^9": (lambda m: m["data_info"].update(num_classes=10**9),
                         "data_info.num_classes: expected an integer in 1..16777216, got 1000000000"),
    "step infinite": (lambda m: m.update(step=float("inf")), "missing or malformed field (OverflowError"),
    "task a path": (lambda m: m["data_info"].update(task="../evil"),
                    "data_info.task: expected a task name (one of "),  # the list holds whatever is registered
    "inputs a string": (lambda m: m["data_info"].update(inputs="x"),
                        "data_info.inputs: expected a list of at most 16 inputs, got 'x'"),
    "an input's shape 1e30": (lambda m: m["data_info"].update(inputs=[{"name": "image", "shape": [1e30],
                                                                        "dtype": "float32", "modality": "image"}]),
                              "data_info.inputs[0].shape[0]: expected an integer in 1..16777216, got 1e+30"),
}


@pytest.mark.parametrize("name", sorted(MODEL_JSON))
def test_eval_of_a_model_json_with_absurd_fields_is_one_line(name, final_dir, tmp_path, capsys):
    edit, expected = MODEL_JSON[name]
    final = corrupted(final_dir, tmp_path, edit)
    code, err, _ = run_cli(["eval", str(final)], capsys)
    line = one_clean_line(code, err)
    assert line.startswith(f"error: {final / 'model.json'}: {expected}") and "restore it or re-run training" in line, line


def test_eval_shows_class_names_from_the_data_escaped(final_dir, tmp_path, capsys):
    """Class names are folder names or labels from the data: the tables show an ESC in one as \\x1b."""
    names = [f"{i}\x1b[2J" if i == 3 else str(i) for i in range(10)]
    final = corrupted(final_dir, tmp_path, lambda m: m["data_info"].update(class_names=names))
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", str(final)])
    out = capsys.readouterr().out
    assert exit_info.value.code in (0, None) and "3\\x1b[2J" in out and "\x1b" not in out, repr(out)
