"""Checkpoints: atomic directories, `latest` last, keep-K, SHA-256 verification, weights_only loading."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from trainforge.errors import UserError
from trainforge.engine.checkpoint import (
    complete_checkpoints,
    find_resume_checkpoint,
    load_checkpoint,
    load_model_weights,
    read_latest,
    save_checkpoint,
)


def _state(step: int) -> dict:
    return {"step": step, "rng": torch.get_rng_state(), "nested": {"a": [1, 2.5, "x"], "t": torch.ones(2)}}


def test_save_load_round_trip_with_weights_only(tmp_path: Path):
    model = nn.Linear(3, 2)
    path = save_checkpoint(tmp_path, 7, model.state_dict(), _state(7), keep=3)
    assert path.name == "step-000007" and read_latest(tmp_path) == path
    weights, state = load_checkpoint(path)
    assert torch.equal(weights["weight"], model.weight.detach())
    assert state["step"] == 7 and state["nested"]["a"] == [1, 2.5, "x"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["sha256"]) == {"model.safetensors", "state.pt"}


def test_keeps_only_the_newest_k(tmp_path: Path):
    model = nn.Linear(2, 2)
    for step in (10, 20, 30, 40):
        save_checkpoint(tmp_path, step, model.state_dict(), _state(step), keep=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-000030", "step-000040"]
    assert read_latest(tmp_path).name == "step-000040"


def test_corrupted_file_is_detected_and_resume_falls_back(tmp_path: Path):
    model = nn.Linear(2, 2)
    save_checkpoint(tmp_path, 1, model.state_dict(), _state(1), keep=5)
    newest = save_checkpoint(tmp_path, 2, model.state_dict(), _state(2), keep=5)
    data = bytearray((newest / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (newest / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(UserError, match="SHA-256 mismatch"):
        load_checkpoint(newest)
    with pytest.warns(UserWarning, match="skipping checkpoint step-000002"):
        assert find_resume_checkpoint(tmp_path).name == "step-000001"


def test_half_written_checkpoint_is_ignored(tmp_path: Path):
    model = nn.Linear(2, 2)
    save_checkpoint(tmp_path, 1, model.state_dict(), _state(1), keep=5)
    # what a SIGKILL during the next save leaves behind: a temp dir, and no `latest` update
    partial = tmp_path / ".tmp-step-000002-999"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"partial")
    assert find_resume_checkpoint(tmp_path).name == "step-000001"
    # killed after the rename but before `latest` was rewritten: `latest` still decides
    save_checkpoint(tmp_path, 3, model.state_dict(), _state(3), keep=5)
    (tmp_path / "latest").write_text("step-000001\n")
    assert find_resume_checkpoint(tmp_path).name == "step-000001"
    # and with `latest` lost altogether, the newest verified directory is used
    (tmp_path / "latest").unlink()
    assert find_resume_checkpoint(tmp_path).name == "step-000003"


def test_saving_the_same_step_twice_replaces_it(tmp_path: Path):
    model = nn.Linear(2, 2)
    save_checkpoint(tmp_path, 5, model.state_dict(), _state(5), keep=2)
    with torch.no_grad():
        model.weight.add_(1)
    path = save_checkpoint(tmp_path, 5, model.state_dict(), _state(5), keep=2)
    weights, _ = load_checkpoint(path)
    assert torch.equal(weights["weight"], model.weight.detach())


def test_tied_weights_saved_once_and_restored(tmp_path: Path):
    m = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    m[1].weight = m[0].weight
    path = save_checkpoint(tmp_path, 1, m.state_dict(), _state(1), keep=1)
    weights, _ = load_checkpoint(path)
    assert len(weights) == 1
    fresh = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    fresh[1].weight = fresh[0].weight
    load_model_weights(fresh, weights)
    assert torch.equal(fresh[1].weight, m[0].weight)


def test_mismatched_model_is_a_user_error(tmp_path: Path):
    path = save_checkpoint(tmp_path, 1, nn.Linear(2, 2).state_dict(), _state(1), keep=1)
    weights, _ = load_checkpoint(path)
    with pytest.raises(UserError, match="does not match the model"):
        load_model_weights(nn.Sequential(nn.Linear(2, 2)), weights)
