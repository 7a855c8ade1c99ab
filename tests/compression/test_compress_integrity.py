"""The folder `trainforge compress` writes carries a SHA-256 manifest; `trainforge predict` refuses a tampered,
missing or unlisted file and mistyped metadata with one line (exit 2), where it used to serve them.

(Named apart from tests/training/test_artifact_integrity.py: test modules here share one namespace.)
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

import trainforge
from test_predict import one_line_error, run_cli
from trainforge.compression import artifact
from trainforge.integrity import sha256_file, write_manifest


@pytest.fixture(scope="module")
def compressed(digits_run, tmp_path_factory) -> Path:
    """fp32 + int8 ONNX of the session's digits run, compressed from a copy of its final/ (no report written)."""
    root = tmp_path_factory.mktemp("sealed")
    final = Path(shutil.copytree(digits_run / "final", root / "final"))
    trainforge.compress(final, root / "compressed", quantize="int8", bench_s=0.02, progress=False)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8), dtype=np.uint8), mode="L").save(root / "digit.png")
    return root


@pytest.fixture
def out(compressed, tmp_path) -> Path:
    """A copy of the compress output folder for one test to damage."""
    return Path(shutil.copytree(compressed / "compressed", tmp_path / "compressed"))


@pytest.fixture
def png(compressed) -> str:
    return str(compressed / "digit.png")


def served(args: list[str], capsys) -> dict:
    code, stdout, err = run_cli(["predict", *args, "--json"], capsys)
    assert code in (0, None), err
    return json.loads(stdout)


def flip_weight_byte(path: Path) -> None:
    """Flip one bit in the middle of the largest weight tensor: the file still loads and runs, differently."""
    data = bytearray(path.read_bytes())
    weights = max((t.raw_data for t in onnx.load(str(path)).graph.initializer), key=len)
    data[data.find(weights) + len(weights) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_compress_seals_every_file_and_predict_verifies(compressed, png, capsys):
    out = compressed / "compressed"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["sha256"] == {name: sha256_file(out / name) for name in ("compress.json", "fp32.onnx", "int8.onnx")}
    assert served([str(out), png], capsys)["variant"] == "int8"
    assert served([str(out / "fp32.onnx"), png], capsys)["variant"] == "fp32"


@pytest.mark.parametrize("variant,target", [("int8.onnx", "folder"), ("int8.onnx", "file"), ("fp32.onnx", "file")])
def test_a_flipped_byte_in_a_variant_is_refused(out, png, capsys, variant, target):
    flip_weight_byte(out / variant)
    assert served([str(out / variant), png, "--no-verify"], capsys)["predictions"]  # what used to be served
    artifact_arg = str(out) if target == "folder" else str(out / variant)
    one_line_error(["predict", artifact_arg, png], capsys, f"{out / variant}: SHA-256 mismatch")


def test_a_deleted_variant_is_not_silently_replaced(out, png, capsys):
    (out / "int8.onnx").unlink()
    one_line_error(["predict", str(out), png], capsys, f"{out / 'int8.onnx'}: missing (listed in")
    assert served([str(out / "fp32.onnx"), png], capsys)["variant"] == "fp32"  # the intact one still serves


def test_a_file_the_manifest_does_not_list_is_refused(out, png, capsys):
    shutil.copy(out / "fp32.onnx", out / "mine.onnx")
    message = one_line_error(["predict", str(out / "mine.onnx"), png], capsys, "mine.onnx: not listed in")
    assert "--no-verify" in message


@pytest.mark.parametrize("target", ["folder", "file"])
def test_a_folder_without_manifest_needs_no_verify(out, png, capsys, target):
    (out / "manifest.json").unlink()
    artifact_arg = str(out) if target == "folder" else str(out / "int8.onnx")
    message = one_line_error(["predict", artifact_arg, png], capsys, "manifest.json: missing")
    assert "pass --no-verify to skip the SHA-256 check" in message
    assert served([artifact_arg, png, "--no-verify"], capsys)["variant"] == "int8"


@pytest.mark.parametrize("field,value", [
    ("preprocess.value_range", ["a", "b"]),
    ("input_shape", [1, "x", "y"]),
    ("preprocess", "zzz"),
    ("class_names", 7),
    ("preprocess.normalize", [1.0]),
])
def test_mistyped_metadata_is_one_line_naming_the_field(out, png, capsys, field, value):
    path = out / "fp32.onnx"
    proto = onnx.load(str(path))
    meta = json.loads(next(p.value for p in proto.metadata_props if p.key == artifact.META_KEY))
    *parents, key = field.split(".")
    node = meta
    for name in parents:
        node = node[name]
    node[key] = value
    artifact.embed_meta(proto, meta)
    onnx.save(proto, str(path))
    write_manifest(out)  # re-sealed: only the metadata check stands between it and a traceback
    message = one_line_error(["predict", str(path), png], capsys, f"{path}: trainforge metadata field {field} must be")
    assert "re-export it" in message


def test_compress_refuses_a_tampered_or_unsealed_checkpoint(compressed, tmp_path, capsys):
    final = Path(shutil.copytree(compressed / "final", tmp_path / "final"))
    weights = final / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    one_line_error(["compress", str(final), "--out", str(tmp_path / "o")], capsys, "model.safetensors: SHA-256 mismatch")
    (final / "manifest.json").unlink()
    one_line_error(["compress", str(final), "--out", str(tmp_path / "o")], capsys, "pass --no-verify")
    assert not (tmp_path / "o").exists()
