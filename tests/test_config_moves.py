"""Config keys in the section they belong to (issue 27, item 5): `train.activation_checkpointing` (was
`distributed.activation_checkpointing`), and what trainforge's own stages record in `stage:` (was `model.pruned`,
`log.mlflow.parent_run_id`). The old spellings keep working, each with a one-line note, and are never dropped."""
from __future__ import annotations

import pytest

from trainforge import config as config_module
from trainforge.config import config_from_dict, load_config
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
    cfg = load_config("digits_cnn", [*extra, f"{old}={value}"])
    assert str(read(cfg)).lower() == value
    err = capsys.readouterr().err
    assert err == f"note: {old} is now {new}; the old spelling still works\n"
    node = cfg.model_dump(mode="json")  # what config.yaml holds: the key at its new place only
    for part in old.split(".")[:-1]:
        node = node[part]
    assert old.split(".")[-1] not in node
    load_config("digits_cnn", [*extra, f"{old}={value}"])
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
        load_config("digits_cnn", ["stage.prunned=true"])
