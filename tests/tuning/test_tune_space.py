"""Search space files: each kind of mistake is one UserError naming the file and key; sampling is typed."""
from __future__ import annotations

import shlex
from pathlib import Path

import optuna
import pytest

from trainforge.config import load_config
from trainforge.data import build_data
from trainforge.errors import UserError
from trainforge.tuning.space import Param, apply_params, load_space, param_from_dict, suggest

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "recipes" / "sweeps" / "digits_cnn.yaml"


@pytest.fixture(scope="module")
def digits():
    cfg = load_config("digits_cnn")
    return cfg.model_dump(mode="json"), build_data(cfg.data, seed=cfg.seed).info


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


BAD = {
    "low >= high": ("optim.lr: {type: float, low: 0.1, high: 0.01}", "optim.lr: low (0.1) must be below high (0.01)"),
    "log with low 0": ("optim.lr: {type: float, low: 0, high: 0.1, log: true}", "optim.lr: log: true needs low > 0"),
    "categorical without choices": ("train.global_batch_size: {type: categorical}", "needs choices"),
    "empty choices": ("train.global_batch_size: {type: categorical, choices: []}", "needs choices"),
    "unknown type": ("optim.lr: {type: loguniform, low: 0.1, high: 1}", "type must be one of float, int, categorical"),
    "unknown field": ("optim.lr: {type: float, low: 0.1, high: 1, scale: log}", "unknown field 'scale'; valid fields:"),
    "unknown config key": ("optim.lrr: {type: float, low: 0.1, high: 1}", "optim.lrr: unknown config key; valid keys under optim:"),
    "unknown section": ("trainer.lr: {type: float, low: 0.1, high: 1}", "trainer.lr: unknown config key; valid keys under the top level"),
    "key below a value": ("optim.lr.max: {type: float, low: 0.1, high: 1}", "optim.lr is a value, not a section"),
    "value the config refuses": ("train.label_smoothing: {type: float, low: 0.0, high: 1.5}",
                                 "train.label_smoothing = 1.5 gives an invalid config: train.label_smoothing"),
    "model argument out of range": ("model.args.dropout: {type: float, low: 0.0, high: 1.5}",
                                    "model.args.dropout = 1.5 gives an invalid config: model.args.dropout: expected a number in [0, 1)"),
    "unknown model argument": ("model.args.depth: {type: int, low: 1, high: 4}", "model.args.depth: unknown argument for model 'cnn'"),
    "int with float bounds": ("train.max_steps: {type: int, low: 1.5, high: 4}", "low must be an integer"),
    "step with log": ("optim.lr: {type: float, low: 0.1, high: 1, log: true, step: 0.1}", "step cannot be combined with log"),
    "step not dividing the range": ("model.args.dropout: {type: float, low: 0, high: 0.5, step: 0.2}", "multiple of step"),
    "choices on a float": ("optim.lr: {type: float, low: 0.1, high: 1, choices: [1]}", "choices is only for type: categorical"),
    "low on a categorical": ("optim.name: {type: categorical, choices: [sgd], low: 1}", "takes only choices; remove low"),
    "a list as a choice": ("model.args.channels: {type: categorical, choices: [[8, 16]]}", "choices must be numbers, strings"),
    "entry not a mapping": ("optim.lr: 0.1", "optim.lr: expected a mapping"),
    "not a mapping": ("- optim.lr", "a search space must be a YAML mapping"),
    "empty file": ("", "the search space is empty"),
    "malformed YAML": ("optim.lr: {type: float, low: [", "malformed YAML"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_space_is_one_user_error_naming_file_and_key(name, tmp_path, digits):
    text, expected = BAD[name]
    path = write(tmp_path, text + "\n")
    with pytest.raises(UserError) as e:
        load_space(path, *digits)
    message = str(e.value)
    assert message.startswith(f"{path}:"), message
    assert expected in message, message
    assert "\n" not in message


def test_missing_space_file(tmp_path, digits):
    with pytest.raises(UserError, match=r"--space: .*nope.yaml does not exist"):
        load_space(tmp_path / "nope.yaml", *digits)


def test_sampling_gives_typed_values_inside_the_space(tmp_path, digits):
    path = write(tmp_path, """\
optim.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
model.args.dropout: {type: float, low: 0.0, high: 0.5, step: 0.1}
train.max_steps: {type: int, low: 10, high: 50, step: 10}
optim.name: {type: categorical, choices: [adamw, sgd]}
""")
    space = load_space(path, *digits)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        params = suggest(study.ask(), space)
        assert 1e-4 <= params["optim.lr"] <= 1e-1
        assert round(params["model.args.dropout"] * 10, 9) == round(params["model.args.dropout"] * 10)
        assert isinstance(params["train.max_steps"], int) and params["train.max_steps"] % 10 == 0
        assert params["optim.name"] in ("adamw", "sgd")
    # the JSON form a worker receives is the same space
    assert {k: param_from_dict(p.to_dict()) for k, p in space.items()} == space


def test_params_set_dotted_keys_without_touching_the_base(digits):
    base, _ = digits
    raw = apply_params(base, {"optim.lr": 0.5, "train.early_stopping.patience": 3, "model.args.dropout": 0.2})
    assert raw["optim"]["lr"] == 0.5 and raw["train"]["early_stopping"]["patience"] == 3
    assert raw["model"]["args"]["dropout"] == 0.2
    assert base["optim"]["lr"] == 3e-3 and base["model"]["args"]["dropout"] == 0.1


def test_example_sweep_is_valid_with_the_command_on_its_first_line(digits):
    first = SWEEP.read_text().splitlines()[0]
    assert first.startswith("# trainforge tune recipes/digits_cnn.yaml --space recipes/sweeps/digits_cnn.yaml")
    words = shlex.split(first.lstrip("# "))
    overrides = [w for w in words if "=" in w]
    cfg = load_config(REPO / "recipes" / "digits_cnn.yaml", overrides)
    space = load_space(SWEEP, cfg.model_dump(mode="json"), digits[1])
    assert {"optim.lr", "optim.weight_decay", "train.label_smoothing", "model.args.dropout",
            "train.global_batch_size"} <= set(space)
    assert space["optim.lr"] == Param("float", low=1e-4, high=3e-2, log=True)
    assert space["train.global_batch_size"].type == "categorical"
