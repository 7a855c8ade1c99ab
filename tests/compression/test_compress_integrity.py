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
from trainforge.compression.recommend import recommend
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


def recommended_file(out: Path) -> str:
    """The file compress recommended (recorded in compress.json): which one depends on this machine's timings."""
    return json.loads((out / "compress.json").read_text())["recommendation"]["file"]


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
    doc = json.loads((out / "compress.json").read_text())
    chosen = [v["name"] for v in doc["variants"] if v["recommended"]]
    assert len(chosen) == 1 and doc["recommendation"]["variant"] == chosen[0]
    from_folder = served([str(out), png], capsys)
    assert (from_folder["variant"], from_folder["chosen_by"]) == (chosen[0], "recommended")
    assert served([str(out / "fp32.onnx"), png], capsys)["variant"] == "fp32"
    assert served([str(out), png, "--variant", "int8"], capsys)["variant"] == "int8"


def test_compress_recommends_the_fastest_within_the_tolerance_by_its_recorded_latencies(compressed):
    """Exactly one variant is recommended, and it follows the rule on the latencies compress recorded (timing on a
    shared machine decides which one; the rule itself is tested with given numbers in test_recommend.py)."""
    doc = json.loads((compressed / "compressed" / "compress.json").read_text())
    rows = {v["name"]: v for v in doc["variants"]}
    best = [name for name, v in rows.items() if v["recommended"] is True]
    assert len(best) == 1 and sum(v["recommended"] is False for v in rows.values()) == len(rows) - 1
    eligible = [v for v in rows.values() if 100 * (rows["fp32"]["accuracy"] - v["accuracy"]) <= 1.0 + 1e-9]
    assert rows[best[0]] in eligible
    assert rows[best[0]]["latency_ms"]["b32"] == min(v["latency_ms"]["b32"] for v in eligible)
    assert rows[best[0]]["latency_ms"]["b32"] <= rows["fp32"]["latency_ms"]["b32"], "never slower than fp32"
    assert recommend(doc["variants"]).name == best[0]
    for v in rows.values():
        assert v["slower_than_fp32"] == (v["latency_ms"]["b32"] > rows["fp32"]["latency_ms"]["b32"])
    assert doc["recommendation"]["reason"].startswith(best[0] + ": ")


def test_the_int8_stem_convolution_stays_float(compressed):
    """digits' first Conv reads 1 channel: float (an int8 im2col GEMM over 9 values is slower); the rest int8."""
    graph = onnx.load(str(compressed / "compressed" / "int8.onnx")).graph
    produced_by = {o: n for n in graph.node for o in n.output}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    quantized_input = [produced_by.get(n.input[0]) is not None and produced_by[n.input[0]].op_type == "DequantizeLinear"
                       for n in convs]
    assert quantized_input == [False] + [True] * (len(convs) - 1)


@pytest.mark.parametrize("variant,target", [("recommended", "folder"), ("int8.onnx", "file"), ("fp32.onnx", "file")])
def test_a_flipped_byte_in_a_variant_is_refused(out, png, capsys, variant, target):
    if variant == "recommended":
        variant = recommended_file(out)
    flip_weight_byte(out / variant)
    assert served([str(out / variant), png, "--no-verify"], capsys)["predictions"]  # what used to be served
    artifact_arg = str(out) if target == "folder" else str(out / variant)
    one_line_error(["predict", artifact_arg, png], capsys, f"{out / variant}: SHA-256 mismatch")


def test_a_deleted_variant_is_not_silently_replaced(out, png, capsys):
    chosen = recommended_file(out)
    other = next(name for name in ("fp32.onnx", "int8.onnx") if name != chosen)
    (out / chosen).unlink()
    one_line_error(["predict", str(out), png], capsys, f"{out / chosen}: missing (listed in")
    assert served([str(out / other), png], capsys)["artifact"] == str(out / other)  # the intact one still serves


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
    expected = "int8" if target == "file" else Path(recommended_file(out)).stem
    assert served([artifact_arg, png, "--no-verify"], capsys)["variant"] == expected


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
