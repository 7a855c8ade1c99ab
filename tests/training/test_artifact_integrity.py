"""final/ carries a SHA-256 manifest; `trainforge eval` refuses tampered, missing or hostile files with one line.

Each attack runs on its own copy of one tiny trained run: it must exit 2 with one line naming the file
(no traceback), where the code before manifests evaluated the tampered model and exited 0.
"""
from __future__ import annotations

import collections
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import trainforge
from test_loop import tiny
from trainforge.cli import main
from trainforge.errors import UserError
from trainforge.integrity import sha256_file
from trainforge.training.artifacts import load_trained
from trainforge.training.evaluate import evaluate_checkpoint


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("integrity") / "run"
    trainforge.train(tiny("train.max_steps=6", "train.checkpoint_every_steps=3"), run_dir=run_dir)
    return run_dir


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A copy of the trained run for one test to damage."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code or 0, captured.out, captured.err


def refused(args: list[str], capsys, *expected: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr holding every `expected` text; that line."""
    code, out, err = cli(args, capsys)
    assert code == 2, (code, err)
    assert "Traceback" not in err and out == ""
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    message = " ".join(err.split())  # rich may wrap a long line on a narrow terminal
    for text in expected:
        assert text in message, message
    return message


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_final_has_a_manifest_and_verifies(trained, capsys):
    final = trained / "final"
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["sha256"] == {name: sha256_file(final / name) for name in ("model.json", "model.safetensors")}
    code, out, err = cli(["eval", str(trained), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["step"] == 6


def test_a_flipped_weight_byte_is_refused(run, capsys):
    weights = run / "final" / "model.safetensors"
    flip_byte(weights, -1)  # the last float's low byte: the file still loads, only the model differs
    assert load_trained(run, verify=False).weights  # i.e. the attack would be served without the check
    refused(["eval", str(run)], capsys, f"{weights}: SHA-256 mismatch", "restore final/")
    refused(["eval", str(run / "final")], capsys, f"{weights}: SHA-256 mismatch")


def test_edited_class_names_are_refused(run, capsys):
    meta_file = run / "final" / "model.json"
    meta = json.loads(meta_file.read_text())
    meta["data_info"]["class_names"] = ["cat"] + list(meta["data_info"]["class_names"])[1:]
    meta_file.write_text(json.dumps(meta, indent=1))
    refused(["eval", str(run)], capsys, f"{meta_file}: SHA-256 mismatch")
    with pytest.raises(UserError, match="model.json: SHA-256 mismatch"):
        evaluate_checkpoint(run)  # the Python API checks too


@pytest.mark.parametrize("name", ["model.safetensors", "model.json"])
def test_a_missing_file_is_refused(run, capsys, name):
    (run / "final" / name).unlink()
    refused(["eval", str(run)], capsys, f"{run / 'final' / name}: missing (listed in")


def test_an_old_final_without_manifest_needs_no_verify(run, capsys):
    (run / "final" / "manifest.json").unlink()
    refused(["eval", str(run)], capsys, "manifest.json: missing", "pass --no-verify to skip the SHA-256 check")
    code, out, err = cli(["eval", str(run), "--no-verify", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["step"] == 6


def test_a_truncated_safetensors_under_no_verify_is_one_line(run, capsys):
    weights = run / "final" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    refused(["eval", str(run), "--no-verify"], capsys, f"{weights}: not a readable safetensors file")


class Sneaky(collections.OrderedDict):
    """A dict subclass: plain pickle would import and build it; weights_only must not."""


class RunsCode:
    """Unpickling this calls os.system: the classic hostile checkpoint."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("payload", ["dict subclass", "os.system"])
def test_a_pickle_payload_state_pt_is_refused(run, capsys, tmp_path, payload):
    ckpt = run / "checkpoints" / "step-000003"
    marker = tmp_path / "pwned"
    obj = Sneaky(step=3) if payload == "dict subclass" else {"step": RunsCode(marker)}
    torch.save(obj, ckpt / "state.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())  # the attacker updates the hash too
    manifest["sha256"]["state.pt"] = sha256_file(ckpt / "state.pt")
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    refused(["eval", str(ckpt)], capsys, f"{ckpt / 'state.pt'}: not a trainforge checkpoint state", "weights_only")
    assert not marker.exists(), "the payload ran"
