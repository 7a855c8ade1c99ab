"""Config: typed recipes, dotted overrides, and one clear line for every kind of bad input."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainforge.config import Config, builtin_recipes, config_from_yaml_text, load_config
from trainforge.errors import UserError


def test_default_recipe_loads_and_overrides_apply():
    cfg = load_config(None, ["optim.lr=3e-4", "train.precision=bf16", "model.args.channels=[8,16]"])
    assert cfg.name == "digits_cnn"
    assert cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.train.precision == "bf16"
    assert cfg.model.args["channels"] == [8, 16]


def test_resolved_config_round_trips_through_yaml():
    cfg = load_config(None, ["train.epochs=2", "train.micro_batch_size=auto"])
    again = config_from_yaml_text(cfg.to_yaml())
    assert again == cfg


@pytest.mark.parametrize("name", sorted(builtin_recipes()))
def test_every_builtin_recipe_validates_and_names_its_command(name):
    path = builtin_recipes()[name]
    first = path.read_text().splitlines()[0]
    assert first.startswith("# trainforge "), f"{path}: first line must be the command that runs it"
    assert isinstance(load_config(path), Config)


BAD_OVERRIDES = [
    (["optim.lr=fast"], "optim.lr: expected a number, got 'fast'"),
    (["train.epochs=1.5"], "train.epochs: expected an integer"),
    (["train.micro_batch_size=-4"], "train.micro_batch_size"),
    (["train.global_batch_size=0"], "train.global_batch_size: input should be greater than 0"),
    (["train.bogus=1"], "train.bogus: unknown key; valid keys here: epochs"),
    (["colour=red"], "colour: unknown key"),
    (["train.precision=fp8"], "train.precision: input should be 'auto', 'fp32', 'bf16' or 'fp16'"),
    (["train.device=tpu"], "train.device: expected one of auto, cpu, cuda"),
    (["data.val_fraction=0.5", "data.test_fraction=0.45"], "must leave at least 10% for training"),
    (["data.augment.crop_scale=[0.9, 0.5]"], "data.augment.crop_scale"),
    (["name=a/b"], "name: must be a plain name"),
    (["optim.lr"], "overrides are KEY=VALUE"),
    (["train..epochs=3"], "empty key segment"),
    (["train.early_stopping.mode=up"], "train.early_stopping.mode"),
    (["data.num_workers=-1"], "data.num_workers"),
]


@pytest.mark.parametrize("overrides,expected", BAD_OVERRIDES)
def test_bad_overrides_give_one_line_naming_the_field(overrides, expected):
    with pytest.raises(UserError) as err:
        load_config(None, overrides)
    message = str(err.value)
    assert expected.lower() in message.lower(), message
    assert "\n" not in message


def test_missing_recipe_file(tmp_path: Path):
    with pytest.raises(UserError, match="recipe file not found"):
        load_config(tmp_path / "nope.yaml")


def test_unknown_recipe_name_lists_builtins():
    with pytest.raises(UserError, match="digits_cnn"):
        load_config("no_such_recipe")


def test_malformed_yaml_names_the_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("# trainforge train bad.yaml\nname: x\ntrain:\n  epochs: [1, 2\n")
    with pytest.raises(UserError, match=r"bad.yaml: line \d+ malformed YAML"):
        load_config(bad)


def test_recipe_that_is_not_a_mapping(tmp_path: Path):
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="must be a YAML mapping"):
        load_config(bad)
