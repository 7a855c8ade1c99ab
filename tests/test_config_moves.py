"""Config keys in the section they belong to (issue 27, item 5): `train.activation_checkpointing` (was
`distributed.activation_checkpointing`), and what trainforge's own stages record in `stage:` (was `model.pruned`,
`log.mlflow.parent_run_id`). The old spellings keep working, each with a one-line note, and are never dropped: in a
recipe for the keys a recipe may set, in a run's stored config for `stage:` (issue 39: a recipe never sets it)."""
from __future__ import annotations

import pytest
import yaml

from trainforge import config as config_module
from trainforge.config import config_from_dict, load_config, parse_override, set_dotted
from trainforge.errors import UserError


@pytest.fixture(autouse=True)
def fresh_notes(monkeypatch):
    monkeypatch.setattr(config_module, "_noted", set())


@pytest.mark.parametrize("old, new, value, read", [
    ("distributed.activation_checkpointing", "train.activation_checkpointing", "true",
     lambda c: c.train.activation_checkpointing),
    ("model.pruned", "stage.pruned", "true", lambda c: c.stage.pruned),
    ("log.mlflow.parent_run_id", "stage.mlflow_parent_run_id", "abc123", lambda c: c.stage.mlflow_parent_run_id),
])
def test_an_old_spelling_is_moved_with_one_note_and_never_dropped(capsys, old, new, value, read):
    extra = ["log.mlflow={}"] if old.startswith("log.mlflow") else []

    def load(*items: str):
        if not new.startswith("stage."):  # a key a recipe may set: from a recipe and its overrides
            return load_config("digits_cnn", list(items))
        stored = yaml.safe_load(load_config("digits_cnn").to_yaml())  # stage: read back from a stored config alone
        for item in items:
            set_dotted(stored, *parse_override(item), label=item)
        return config_from_dict(stored)

    cfg = load(*extra, f"{old}={value}")
    assert str(read(cfg)).lower() == value
    err = capsys.readouterr().err
    assert err == f"note: {old} is now {new}; the old spelling still works\n"
    node = cfg.model_dump(mode="json")  # what config.yaml holds: the key at its new place only
    for part in old.split(".")[:-1]:
        node = node[part]
    assert old.split(".")[-1] not in node
    load(*extra, f"{old}={value}")
    assert capsys.readouterr().err == ""  # once per process
    assert str(read(config_from_dict(cfg.model_dump(mode="json")))).lower() == value  # config.yaml round trip


def test_the_old_and_new_spelling_with_different_values_is_one_line():
    with pytest.raises(UserError, match="distributed.activation_checkpointing: moved to train.activation_checkpointing, "
                                        "which is given too with another value; keep train.activation_checkpointing"):
        load_config("digits_cnn", ["distributed.activation_checkpointing=true", "train.activation_checkpointing=false"])
    cfg = load_config("digits_cnn", ["distributed.activation_checkpointing=true", "train.activation_checkpointing=true"])
    assert cfg.train.activation_checkpointing


def test_the_new_sections_refuse_unknown_keys_like_the_others():
    with pytest.raises(UserError, match="stage.prunned"):
        config_from_dict({"stage": {"prunned": True}})


@pytest.mark.parametrize("override", ["stage.mlflow_parent_run_id=abc", "stage.pruned=true", "stage.pruned=false",
                                      "stage={}", "model.pruned=true", "log.mlflow.parent_run_id=abc"])
def test_a_recipe_never_sets_the_stage_section(override, tmp_path):
    key = override.split("=")[0]
    with pytest.raises(UserError, match=rf"^{key}: set by trainforge's own stages .* remove it from the overrides$"):
        load_config("digits_cnn", [override])
    recipe = tmp_path / "r.yaml"
    recipe.write_text("stage:\n  mlflow_parent_run_id: abc\n")
    with pytest.raises(UserError, match=r"^stage.mlflow_parent_run_id: .* remove it from the recipe r.yaml$"):
        load_config(recipe)


def test_a_plain_runs_config_is_a_recipe_again_and_a_stage_run_keeps_its_stage(tmp_path):
    plain = load_config("digits_cnn")
    assert "stage" not in plain.to_yaml()
    (tmp_path / "config.yaml").write_text(plain.to_yaml())
    assert load_config(tmp_path / "config.yaml") == plain
    pruned = config_from_dict({**plain.model_dump(mode="json"), "stage": {"pruned": True}})
    assert config_from_dict(yaml.safe_load(pruned.to_yaml())).stage.pruned  # read back on resume
