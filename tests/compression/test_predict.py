"""`trainforge predict`: exported ONNX artifacts served with onnxruntime + numpy only.

Served inputs must equal the training pipeline's inputs (bit for bit where the files are the same),
predictions must equal the torch model's, the serving path must never import torch, and bad input
exits 2 with one line.
"""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
from PIL import Image
from torch import nn

from no_torch import NO_TORCH
from trainforge.cli import main
from trainforge.compression import artifact
from trainforge.compression.predict import predict, rank, resolve_artifact, softmax
from trainforge.compression.serving import modality_reader
from trainforge.config import DataConfig
from trainforge.data import build_data
from trainforge.data.base import DataInfo
from trainforge.data.text import encode
from trainforge.integrity import write_manifest

SEQ_LEN = 16
TEXT_CLASSES = ("neg", "neu", "pos")
FEATURES = ("a", "b", "c", "d")
FEATURE_MEAN = [1.0, -2.0, 0.5, 10.0]
FEATURE_STD = [2.0, 0.5, 1.5, 4.0]


# ---- building artifacts ----------------------------------------------------------------------------------


def export(model: nn.Module, example: torch.Tensor, path: Path) -> Path:
    torch.onnx.export(
        model.eval(), (example,), path, dynamo=True, dynamic_shapes=({0: torch.export.Dim("batch")},),
        input_names=["input"], output_names=["logits"], external_data=False,
    )
    return path


def with_meta(src: Path, dest: Path, meta: dict) -> Path:
    """`src` with trainforge metadata as `dest`, listed (like every file beside it) in its folder's manifest."""
    proto = onnx.load(src)
    artifact.embed_meta(proto, meta)
    onnx.save(proto, dest)
    write_manifest(dest.parent)
    return dest


def text_meta(variant: str = "fp32", tokenizer: str = "bytes", vocab_size: int = 257, task: str = "classification") -> dict:
    info = DataInfo(task, "text", (SEQ_LEN,), "int64", len(TEXT_CLASSES), TEXT_CLASSES, vocab_size, SEQ_LEN)
    pre = {"modality": "text", "task": task, "tokenizer": tokenizer, "seq_len": SEQ_LEN, "vocab_size": vocab_size,
           "class_names": list(TEXT_CLASSES)}
    return artifact.artifact_meta(variant, info, pre)


def tabular_meta(variant: str = "fp32") -> dict:
    info = DataInfo("classification", "tabular", (4,), "float32", 3, ("x", "y", "z"))
    pre = {"modality": "tabular", "task": "classification", "num_features": 4, "feature_names": list(FEATURES),
           "normalize": {"kind": "zscore", "mean": FEATURE_MEAN, "std": FEATURE_STD}, "class_names": ["x", "y", "z"]}
    return artifact.artifact_meta(variant, info, pre)


class TextNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(257, 8)
        self.head = nn.Linear(8, len(TEXT_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x).mean(dim=1))


def write_digit_png(path: Path, raw: np.ndarray) -> Path:
    """Ink counts 0..16 -> 8-bit grey, the nearest a PNG holds to the training values."""
    Image.fromarray(np.round(raw * 255.0 / 16.0).astype(np.uint8), mode="L").save(path)
    return path


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """A small CNN trained briefly on the real digits bundle, exported; PNGs of 40 test images."""
    root = tmp_path_factory.mktemp("digits")
    bundle = build_data(DataConfig(source="digits"), seed=0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10))
    pairs = [bundle.train[i] for i in range(len(bundle.train))]  # int index: no augmentation
    x, y = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(120):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    model.eval()
    plain = export(model, x[:2], root / "plain.onnx")
    path = with_meta(plain, root / "fp32.onnx", artifact.artifact_meta("fp32", bundle.info, bundle.preprocess))
    test = bundle.test
    n = 40
    pngs = [str(write_digit_png(root / f"{i}.png", test.samples.x[int(test.indices[i])][0].numpy())) for i in range(n)]
    test_x = torch.stack([test[i][0] for i in range(n)])
    test_y = torch.stack([test[i][1] for i in range(n)])
    return SimpleNamespace(model=model, path=path, plain=plain, pngs=pngs, test_x=test_x, test_y=test_y,
                           meta=artifact.artifact_meta("fp32", bundle.info, bundle.preprocess))


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    root = tmp_path_factory.mktemp("text")
    torch.manual_seed(1)
    model = TextNet().eval()
    plain = export(model, torch.randint(0, 257, (2, SEQ_LEN)), root / "plain.onnx")
    return SimpleNamespace(model=model, plain=plain, path=with_meta(plain, root / "text.onnx", text_meta()), root=root)


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    root = tmp_path_factory.mktemp("tabular")
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    plain = export(model, torch.randn(2, 4), root / "plain.onnx")
    return SimpleNamespace(model=model, plain=plain, path=with_meta(plain, root / "tabular.onnx", tabular_meta()), root=root)


def torch_argmax(model: nn.Module, x: torch.Tensor) -> list[int]:
    with torch.no_grad():
        return model(x).argmax(dim=1).tolist()


def served(meta: dict, inputs: list[str]) -> list[np.ndarray]:
    return [x for _, x in modality_reader(meta, "artifact.onnx")(inputs)]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def run_json(args: list[str], capsys) -> dict:
    code, out, err = run_cli([*args, "--json"], capsys)
    assert code in (0, None), err
    return json.loads(out)


# ---- (a) served inputs are the training inputs; predictions are the torch model's ----------------------


def test_digit_pngs_serve_the_training_inputs_and_the_torch_predictions(digits, capsys):
    xs = np.stack(served(digits.meta, digits.pngs))
    # a PNG holds 8-bit grey, the training data 0..16 ink counts: at most half a grey level apart
    half_level = 0.5 * 16 / 255 / min(digits.meta["preprocess"]["normalize"]["std"])
    assert np.abs(xs - digits.test_x.numpy()).max() <= half_level + 1e-6
    doc = run_json(["predict", str(digits.path), *digits.pngs], capsys)
    assert doc["variant"] == "fp32" and doc["artifact"] == str(digits.path)
    preds = doc["predictions"]
    assert [p["input"] for p in preds] == digits.pngs
    assert [p["index"] for p in preds] == torch_argmax(digits.model, torch.from_numpy(xs))
    assert [p["label"] for p in preds] == [str(p["index"]) for p in preds]
    # against the exact training tensors: the same class wherever the rounding to 8 bits cannot matter
    with torch.no_grad():
        top2 = digits.model(digits.test_x).topk(2, dim=1)
    clear = (top2.values[:, 0] - top2.values[:, 1] > 0.5).tolist()
    assert sum(clear) >= 35
    assert all(p["index"] == int(i) for p, i, c in zip(preds, top2.indices[:, 0], clear) if c)
    with torch.no_grad():
        probs = torch.softmax(digits.model(torch.from_numpy(xs)), dim=1).numpy()
    np.testing.assert_allclose([p["probability"] for p in preds], probs.max(axis=1), rtol=1e-4)
    accuracy = np.mean([p["index"] == int(y) for p, y in zip(preds, digits.test_y)])
    assert accuracy >= 0.8, accuracy  # the model learned digits, so the checks above are not vacuous


def write_image_tree(root: Path) -> None:
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / name / f"{i}.png")


@pytest.mark.parametrize("normalize,grayscale", [("zscore", False), ("minmax", True), ("none", False)])
def test_imagefolder_files_serve_bit_identical_inputs(tmp_path, normalize, grayscale):
    write_image_tree(tmp_path / "images")
    cfg = DataConfig(source="imagefolder", path=str(tmp_path / "images"), normalize=normalize,
                     args={"image_size": 8, "grayscale": grayscale})
    bundle = build_data(cfg, seed=0)
    meta = artifact.artifact_meta("fp32", bundle.info, bundle.preprocess)
    for split in (bundle.train, bundle.val, bundle.test):
        paths = [split.samples.paths[int(i)] for i in split.indices]
        for x, i in zip(served(meta, paths), range(len(split))):
            expected = split[i][0].numpy()
            assert x.dtype == np.float32 and np.array_equal(x, expected)


def test_csv_rows_serve_bit_identical_inputs(tmp_path):
    rng = np.random.default_rng(3)
    lines = ["label,w,a,v,b"]
    for i in range(40):
        values = rng.normal(size=4) * [3.0, 0.01, 100.0, 1.0]
        lines.append("xyz"[i % 3] + "," + ",".join(repr(float(v)) for v in values))
    path = tmp_path / "rows.csv"
    path.write_text("\n".join(lines) + "\n")
    bundle = build_data(DataConfig(source="csv", path=str(path)), seed=0)
    meta = artifact.artifact_meta("fp32", bundle.info, bundle.preprocess)
    assert meta["preprocess"]["feature_names"] == ["w", "a", "v", "b"]
    reader = modality_reader({**meta, "modality": "tabular"}, "artifact.onnx")
    by_line = {name.rsplit(":", 1)[1]: x for name, x in reader([str(path)])}
    for split in (bundle.train, bundle.val, bundle.test):
        for i, idx in enumerate(split.indices):
            line = split.samples.ids[int(idx)].removeprefix("line ")
            assert np.array_equal(by_line[line], split[i][0].numpy())


def test_text_lines_serve_the_jsonl_training_tokens(tmp_path):
    texts = ["good movie", "naïve café ☕ " * 3, "bad", "  padded with spaces  ", "x" * 40, "meh"] * 3
    labels = ["pos", "neu", "neg"] * 6
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps({"text": t, "label": lab}) for t, lab in zip(texts, labels)))
    (tmp_path / "lines.txt").write_text("\n".join(texts) + "\n")
    cfg = DataConfig(source="jsonl", path=str(tmp_path / "train.jsonl"), args={"seq_len": SEQ_LEN}, clean={"dedup": False})
    bundle = build_data(cfg, seed=0)
    meta = artifact.artifact_meta("fp32", bundle.info, bundle.preprocess)
    tokens = served(meta, [str(tmp_path / "lines.txt")])
    for split in (bundle.train, bundle.val, bundle.test):
        for i, idx in enumerate(split.indices):
            line_no = int(split.samples.ids[int(idx)].removeprefix("line "))
            assert np.array_equal(tokens[line_no - 1], split[i][0].numpy())


# ---- (c) text lines, stdin, CSV rows, batching ------------------------------------------------------------


TEXT_LINES = ["great fun", "", "awful", "   ", "it was fine I guess", "ünïcödé ok", "a" * 50]


def test_text_file_lines_and_stdin_give_the_torch_predictions(text, capsys, monkeypatch):
    path = text.root / "lines.txt"
    path.write_bytes("\r\n".join(TEXT_LINES).encode("utf-8"))  # CRLF line ends: not part of the text
    kept = [line for line in TEXT_LINES if line.strip()]
    expected = torch_argmax(text.model, torch.tensor([encode(line, SEQ_LEN) for line in kept]))
    doc = run_json(["predict", str(text.path), str(path), "--top-k", "2"], capsys)
    assert [p["input"] for p in doc["predictions"]] == kept
    assert [p["index"] for p in doc["predictions"]] == expected
    assert all(len(p["top"]) == 2 and p["top"][0] == [p["label"], p["probability"]] for p in doc["predictions"])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(TEXT_LINES).encode("utf-8"))))
    from_stdin = run_json(["predict", str(text.path), "-", "--top-k", "2"], capsys)["predictions"]
    assert from_stdin == doc["predictions"]


def test_integer_token_lines_for_a_synthetic_text_model(text, capsys):
    path = with_meta(text.plain, text.root / "ids.onnx", text_meta(tokenizer="none", vocab_size=256))
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 256, (5, SEQ_LEN))
    lines = text.root / "ids.txt"
    lines.write_text("\n".join(" ".join(map(str, row)) for row in ids) + "\n")
    doc = run_json(["predict", str(path), str(lines)], capsys)
    assert [p["index"] for p in doc["predictions"]] == torch_argmax(text.model, torch.from_numpy(ids))


def test_csv_rows_by_column_name_give_the_torch_predictions(tabular, capsys, monkeypatch):
    rng = np.random.default_rng(5)
    x = rng.normal(FEATURE_MEAN, FEATURE_STD, size=(9, 4))
    path = tabular.root / "rows.csv"
    # columns shuffled, an extra column, a blank line: matched by name, extra ignored
    lines = ["id,d,b,extra,a,c"] + [f"r{i},{r[3]},{r[1]},zzz,{r[0]},{r[2]}" for i, r in enumerate(x)]
    lines.insert(4, "")
    path.write_text("\n".join(lines) + "\n")
    reference = (x.astype(np.float32) - np.float32(FEATURE_MEAN)) / np.float32(FEATURE_STD)
    expected = torch_argmax(tabular.model, torch.from_numpy(reference))
    doc = run_json(["predict", str(tabular.path), str(path), "--batch-size", "2", "--threads", "1"], capsys)
    preds = doc["predictions"]
    assert [p["index"] for p in preds] == expected
    assert [p["input"] for p in preds][:4] == [f"{path}:{n}" for n in (2, 3, 4, 6)]  # line 5 is blank
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    from_stdin = run_json(["predict", str(tabular.path), "-"], capsys)["predictions"]
    assert [p["index"] for p in from_stdin] == expected and from_stdin[0]["input"] == "stdin:2"


def test_batch_size_and_top_k_do_not_change_the_answers(digits):
    whole = predict(digits.path, digits.pngs[:7], top_k=10, batch_size=32)["predictions"]
    in_threes = predict(digits.path, digits.pngs[:7], top_k=10, batch_size=3)["predictions"]
    one_by_one = predict(digits.path, digits.pngs[:7], top_k=99, batch_size=1, threads=1)["predictions"]
    for a, b, c in zip(whole, in_threes, one_by_one):
        assert a["index"] == b["index"] == c["index"]
        assert len(a["top"]) == len(c["top"]) == 10  # clamped to the number of classes
        np.testing.assert_allclose([p for _, p in a["top"]], [p for _, p in b["top"]], rtol=1e-5)
        probs = [p for _, p in a["top"]]
        assert probs == sorted(probs, reverse=True) and abs(sum(probs) - 1) < 1e-6


def test_table_output_shows_inputs_literally(text, capsys):
    path = text.root / "markup.txt"
    path.write_text("[bold]not markup[/bold]\nplain\n")
    code, out, _ = run_cli(["predict", str(text.path), str(path)], capsys)
    assert code in (0, None)
    assert "[bold]not markup[/bold]" in out and "probability" in out
    assert any(name in out for name in TEXT_CLASSES)


def test_softmax_and_rank():
    probs = softmax(np.array([[1000.0, 1000.0, 0.0], [0.0, 1.0, 2.0]], dtype=np.float32))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert rank(probs[0], 2) == [0, 1]  # a tie goes to the lower index, as argmax does
    assert rank(probs[1], 3) == [2, 1, 0]


# ---- choosing a variant in a compress output folder; an int8 model ---------------------------------------


FILES = {"fp32": "fp32.onnx", "pruned": "pruned.onnx", "int8": "int8.onnx", "pruned+int8": "pruned-int8.onnx"}


def compress_folder(tabular, folder: Path, b32_ms: dict, recommended: str | None = None, accuracy: dict | None = None) -> Path:
    """A compress output folder of tabular variants (each file tagged with its variant name) whose compress.json
    records `b32_ms` latencies and, unless None, marks `recommended`; sealed by a manifest."""
    folder.mkdir(exist_ok=True)
    variants = []
    for name, ms in b32_ms.items():
        with_meta(tabular.plain, folder / FILES[name], tabular_meta(name))
        variants.append({"name": name, "path": f"/elsewhere/{FILES[name]}", "bytes": 1000 - len(variants),
                         "latency_ms": {"b1": ms / 10, "b32": ms}, "accuracy": (accuracy or {}).get(name, 0.9)})
        if recommended is not None:
            variants[-1]["recommended"] = name == recommended
    (folder / "compress.json").write_text(json.dumps({"task": "classification", "variants": variants}))
    write_manifest(folder)
    return folder


def rows_csv(tmp_path: Path) -> str:
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b,c,d\n1,2,3,4\n")
    return str(rows)


def test_a_folder_serves_its_recommended_variant_not_the_most_compressed(tabular, tmp_path, capsys):
    # issue 12: int8 ran 0.26x fp32's speed, yet the folder served it as "the most compressed"
    out = compress_folder(tabular, tmp_path / "c", {"fp32": 1.6, "int8": 5.9}, recommended="fp32")
    assert resolve_artifact(out).file == out / "fp32.onnx"
    doc = run_json(["predict", str(out), rows_csv(tmp_path)], capsys)
    assert (doc["variant"], doc["recommended"], doc["chosen_by"]) == ("fp32", "fp32", "recommended")
    assert doc["artifact"] == str(out / "fp32.onnx")
    code, table, _ = run_cli(["predict", str(out), rows_csv(tmp_path)], capsys)
    assert code in (0, None) and "(fp32, recommended by compress)" in " ".join(table.split())


def test_the_recorded_choice_is_served_without_measuring(tabular, tmp_path, capsys, monkeypatch):
    import trainforge.compression.bench as bench

    monkeypatch.setattr(bench, "latency_ms", lambda *a, **k: pytest.fail("predict must not time anything"))
    out = compress_folder(tabular, tmp_path / "c", {"fp32": 1.6, "int8": 1.0, "pruned": 1.2, "pruned+int8": 0.8},
                          recommended="pruned")  # what compress decided (e.g. an accuracy tolerance), not re-derived
    assert run_json(["predict", str(out), rows_csv(tmp_path)], capsys)["variant"] == "pruned"


def test_a_record_without_a_recommendation_is_decided_from_its_own_numbers(tabular, tmp_path, capsys):
    out = compress_folder(tabular, tmp_path / "c", {"fp32": 1.6, "int8": 1.0, "pruned+int8": 0.8},
                          accuracy={"fp32": 0.9, "int8": 0.9, "pruned+int8": 0.85})  # written before this change
    assert run_json(["predict", str(out), rows_csv(tmp_path)], capsys)["variant"] == "int8"


@pytest.mark.parametrize("name", ["fp32", "int8", "pruned+int8"])
def test_variant_serves_the_named_one(tabular, tmp_path, capsys, name):
    out = compress_folder(tabular, tmp_path / "c", {"fp32": 1.6, "int8": 5.9, "pruned+int8": 2.0}, recommended="fp32")
    doc = run_json(["predict", str(out), rows_csv(tmp_path), "--variant", name], capsys)
    assert (doc["variant"], doc["chosen_by"], doc["recommended"]) == (name, "--variant", "fp32")
    assert doc["artifact"] == str(out / FILES[name])


def test_an_unknown_variant_lists_the_valid_names(tabular, tmp_path, capsys):
    out = compress_folder(tabular, tmp_path / "c", {"fp32": 1.6, "int8": 5.9}, recommended="fp32")
    message = one_line_error(["predict", str(out), rows_csv(tmp_path), "--variant", "int4"], capsys, "--variant: no variant 'int4'")
    assert message.endswith("valid names: fp32, int8")
    one_line_error(["predict", str(out / "int8.onnx"), rows_csv(tmp_path), "--variant", "int8"], capsys,
                   "--variant: chooses among the variants of a compress output folder")


def test_a_folder_without_compress_json_needs_variant(tabular, tmp_path, capsys):
    for name in ("fp32.onnx", "int8.onnx", "notes.onnx"):
        shutil.copy(tabular.path, tmp_path / name)
    write_manifest(tmp_path)
    one_line_error(["predict", str(tmp_path), rows_csv(tmp_path)], capsys,
                   "has no compress.json saying which variant to serve; pass --variant NAME (one of fp32, int8)")
    assert run_json(["predict", str(tmp_path), rows_csv(tmp_path), "--variant", "int8"], capsys)["artifact"] == str(tmp_path / "int8.onnx")


def test_a_swapped_recommendation_is_refused(tabular, tmp_path, capsys):
    out = compress_folder(tabular, tmp_path / "c", {"fp32": 1.6, "int8": 5.9}, recommended="fp32")
    record = json.loads((out / "compress.json").read_text())
    for v in record["variants"]:
        v["recommended"] = v["name"] == "int8"
    (out / "compress.json").write_text(json.dumps(record))
    one_line_error(["predict", str(out), rows_csv(tmp_path)], capsys, f"{out / 'compress.json'}: SHA-256 mismatch")


@pytest.mark.parametrize("content", ["{not json", '{"variants": 3}', '{"variants": [{"name": "int8", "path": "int8.onnx"}]}'])
def test_a_damaged_compress_json_is_one_line(tabular, tmp_path, capsys, content):
    out = compress_folder(tabular, tmp_path / "c", {"fp32": 1.6, "int8": 5.9})
    (out / "compress.json").write_text(content)
    one_line_error(["predict", str(out), rows_csv(tmp_path), "--no-verify"], capsys, "compress.json is damaged")


def test_an_int8_quantized_artifact_is_served(tabular, tmp_path, capsys):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = tmp_path / "compressed"
    out.mkdir()
    with_meta(tabular.plain, out / "fp32.onnx", tabular_meta("fp32"))
    quantize_dynamic(str(out / "fp32.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    with_meta(tmp_path / "q.onnx", out / "int8.onnx", tabular_meta("int8"))
    assert any(n.op_type.startswith(("DynamicQuantize", "MatMulInteger")) for n in onnx.load(out / "int8.onnx").graph.node)
    x = np.random.default_rng(6).normal(FEATURE_MEAN, FEATURE_STD, size=(50, 4))
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b,c,d\n" + "".join(",".join(map(str, r)) + "\n" for r in x))
    int8 = run_json(["predict", str(out), str(rows), "--variant", "int8"], capsys)
    fp32 = run_json(["predict", str(out / "fp32.onnx"), str(rows)], capsys)
    assert int8["variant"] == "int8" and fp32["variant"] == "fp32"
    agree = np.mean([a["index"] == b["index"] for a, b in zip(int8["predictions"], fp32["predictions"])])
    assert agree >= 0.9, agree


# ---- (b) the serving path imports nothing of torch ----------------------------------------------------




@pytest.mark.parametrize("modality", ["image", "text", "tabular"])
def test_predict_runs_without_torch(modality, digits, text, tabular, tmp_path, capsys):
    script = tmp_path / "no_torch.py"
    script.write_text(NO_TORCH)
    stdin = None
    if modality == "image":
        args, expected = [str(digits.path), *digits.pngs[:5]], torch_argmax(digits.model, digits.test_x[:5])
    elif modality == "text":
        stdin = "great fun\n\nawful\n"
        args = [str(text.path), "-"]
        expected = torch_argmax(text.model, torch.tensor([encode(s, SEQ_LEN) for s in ("great fun", "awful")]))
    else:
        rows = tmp_path / "rows.csv"
        rows.write_text("a,b,c,d\n1,-2,0.5,10\n3,-1,2,4\n")
        args = [str(tabular.path), str(rows)]
        expected = predict(tabular.path, [str(rows)])["predictions"]
        expected = [p["index"] for p in expected]
    proc = subprocess.run([sys.executable, str(script), "predict", *args, "--json"], input=stdin,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH_MODULES=[]" in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)  # exactly one JSON document on stdout
    assert [p["index"] for p in doc["predictions"]] == expected


# ---- (d) bad input: exit 2, one line naming the file and the fix --------------------------------------------


def one_line_error(args: list[str], capsys, expected: str) -> str:
    code, out, err = run_cli(args, capsys)
    assert code == 2, (code, err)
    assert "Traceback" not in err and out == ""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    message = " ".join(err.split())  # rich may wrap a long line on a narrow terminal
    assert expected in message, message
    return message


def test_missing_artifact(tmp_path, capsys):
    one_line_error(["predict", str(tmp_path / "nope.onnx"), "x.png"], capsys, "nope.onnx does not exist")


def test_an_onnx_without_metadata(digits, capsys):
    one_line_error(["predict", str(digits.plain), *digits.pngs[:1]], capsys, "without trainforge metadata")


def test_a_file_that_is_not_onnx(tmp_path, capsys):
    (tmp_path / "model.onnx").write_text("not a model")
    write_manifest(tmp_path)  # intact as written: onnxruntime is the one to refuse it
    one_line_error(["predict", str(tmp_path / "model.onnx"), "x.png"], capsys, "is not a readable ONNX model")


def test_a_folder_without_variants(tmp_path, capsys):
    (tmp_path / "other.onnx").write_bytes(b"")
    one_line_error(["predict", str(tmp_path), "x.png"], capsys, "it has other.onnx: pass one of them")


def test_an_unreadable_image(digits, tmp_path, capsys):
    bad = tmp_path / "bad.png"
    bad.write_text("this is not an image")
    msg = one_line_error(["predict", str(digits.path), digits.pngs[0], str(bad)], capsys, "is not a readable image")
    assert str(bad) in msg


def test_a_truncated_image(digits, tmp_path, capsys):
    big = tmp_path / "big.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8), mode="L").save(big)
    cut = tmp_path / "cut.png"
    cut.write_bytes(big.read_bytes()[:300])
    one_line_error(["predict", str(digits.path), str(cut)], capsys, f"{cut} is not a readable image")


def test_a_missing_image(digits, tmp_path, capsys):
    one_line_error(["predict", str(digits.path), str(tmp_path / "gone.png")], capsys, "gone.png does not exist")


def test_stdin_for_an_image_model(digits, capsys):
    one_line_error(["predict", str(digits.path), "-"], capsys, "'-' (standard input) serves text and CSV models")


def test_a_csv_missing_a_column(tabular, tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b,d\n1,2,3\n")
    one_line_error(["predict", str(tabular.path), str(rows)], capsys, f"INPUT: {rows} lacks column(s) 'c'")


def test_a_csv_cell_that_is_not_a_number(tabular, tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b,c,d\n1,2,3,4\n1,2,three,4\n")
    one_line_error(["predict", str(tabular.path), str(rows)], capsys, f"{rows} row 2 (line 3), column 'c': 'three' is not a finite number")


def test_a_csv_with_an_empty_cell(tabular, tmp_path, capsys):
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b,c,d\n1,,3,4\n")
    one_line_error(["predict", str(tabular.path), str(rows)], capsys, "row 1 (line 2), column 'b': '' is not a finite number")


def test_no_inputs(digits, capsys):
    one_line_error(["predict", str(digits.path)], capsys, "INPUT: no inputs given")


def test_a_text_file_without_lines(text, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n\n")
    one_line_error(["predict", str(text.path), str(empty)], capsys, "held no inputs")


def test_a_language_model_artifact(text, tmp_path, capsys):
    lm = with_meta(text.plain, tmp_path / "lm.onnx", text_meta(task="lm"))
    lines = tmp_path / "lines.txt"
    lines.write_text("hello\n")
    # the served tasks are listed (a test worker may have registered more than the shipped classification)
    message = one_line_error(["predict", str(lm), str(lines)], capsys, "predict serves classification")
    assert "is a 'lm' model (a language model: sample from it with the checkpoint instead)" in message


@pytest.mark.parametrize("line,expected", [
    ("1 2 3", "line 1: 3 token ids; the model takes exactly 16"),
    (" ".join(["7"] * 15 + ["x"]), "line 1: expected space-separated integer token ids"),
    (" ".join(["7"] * 15 + ["256"]), "line 1: token ids must be in 0..255"),
])
def test_bad_token_id_lines(text, tmp_path, capsys, line, expected):
    path = with_meta(text.plain, tmp_path / "ids.onnx", text_meta(tokenizer="none", vocab_size=256))
    lines = tmp_path / "ids.txt"
    lines.write_text(line + "\n")
    one_line_error(["predict", str(path), str(lines)], capsys, expected)


@pytest.mark.parametrize("option", ["--top-k", "--batch-size", "--threads"])
def test_options_below_one(digits, capsys, option):
    one_line_error(["predict", str(digits.path), digits.pngs[0], option, "0"], capsys, f"{option}: must be at least 1, got 0")


# ---- (e) arrays: any model reads .npz/.npy as its graph takes them; hostile array files are one line --------


def test_arrays_serve_what_the_files_serve(digits, tmp_path, capsys):
    """The preprocessed inputs saved as arrays (a batch in one .npy, one sample per .npz) predict exactly what the
    image files predict: the array path feeds the graph the same numbers, without preprocessing them again."""
    xs = np.stack(served(digits.meta, digits.pngs[:6]))
    from_files = run_json(["predict", str(digits.path), *digits.pngs[:6]], capsys)["predictions"]
    np.save(tmp_path / "batch.npy", xs)
    singles = []
    for i, x in enumerate(xs):
        np.savez(tmp_path / f"{i}.npz", input=x)
        singles.append(str(tmp_path / f"{i}.npz"))
    batch = run_json(["predict", str(digits.path), str(tmp_path / "batch.npy")], capsys)["predictions"]
    one_by_one = run_json(["predict", str(digits.path), *singles], capsys)["predictions"]
    assert [p["input"] for p in batch] == [f"{tmp_path / 'batch.npy'}[{i}]" for i in range(6)]
    assert [p["input"] for p in one_by_one] == singles
    for got in (batch, one_by_one):
        assert [(p["index"], p["probability"]) for p in got] == [(p["index"], p["probability"]) for p in from_files]


def _hostile(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / ("bad.npy" if kind in ("pickle", "ndim") else "bad.npz")
    x = np.zeros((1, 8, 8), np.float32)
    if kind == "pickle":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "ndim":
        np.save(path, np.zeros((2, 2, 1, 8, 8), np.float32))
    elif kind == "nan":
        np.savez(path, input=np.where(x == 0, np.nan, x))
    elif kind == "names":
        np.savez(path, image=x, other=x)
    elif kind == "strings":
        np.savez(path, input=np.full((1, 8, 8), "a"))
    elif kind == "not_zip":
        path.write_text("not an archive")
    elif kind in ("claims", "claims_npz"):  # a header claiming 4 TiB over 64 bytes of data
        from numpy.lib import format as npy

        header = io.BytesIO()
        npy.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)})
        data = header.getvalue() + b"\0" * 64
        if kind == "claims":
            path = tmp_path / "claims.npy"
            path.write_bytes(data)
        else:
            import zipfile

            with zipfile.ZipFile(path, "w") as archive:
                archive.writestr("input.npy", data)
    elif kind == "inflates":
        np.savez_compressed(path, input=np.zeros((64, 1, 8, 8), np.float32))  # 16 KiB inflated, a few bytes stored
    return path


@pytest.mark.parametrize("kind,expected", [
    ("pickle", "is not a readable numpy file"),  # an object array is never unpickled
    ("ndim", "has shape [2, 2, 1, 8, 8]; the model takes 3-dimensional samples"),
    ("nan", "holds NaN or infinite values"),
    ("names", "holds image, other; the model takes input"),
    ("strings", "the model takes real numbers"),
    ("not_zip", "is not a readable numpy file"),
    ("inflates", "once decompressed"),
    ("claims", "claims a [1099511627776] float32 array, more than the"),
    ("claims_npz", "claims a [1099511627776] float32 array, more than the"),
])
def test_a_hostile_array_file_is_one_line(digits, tmp_path, capsys, monkeypatch, kind, expected):
    from trainforge.compression import serving

    monkeypatch.setattr(serving, "MAX_ARRAY_BYTES", 8 << 10)  # the bound, scaled down to the test's files
    one_line_error(["predict", str(digits.path), str(_hostile(tmp_path, kind))], capsys, expected)


def test_arrays_and_files_do_not_mix_in_one_call(digits, tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.zeros((1, 8, 8), np.float32))
    one_line_error(["predict", str(digits.path), str(tmp_path / "a.npy"), digits.pngs[0]], capsys,
                   "pass either arrays (.npz, .npy) or image inputs")


def test_a_model_of_several_inputs_asks_for_arrays_by_name(digits, tmp_path, capsys):
    two = [{"name": "image", "shape": [1, 8, 8], "dtype": "float32", "modality": "image"},
           {"name": "features", "shape": [6], "dtype": "float32", "modality": "tabular"}]
    older = {k: v for k, v in digits.meta.items() if k != "graph_inputs"}  # an artifact from before graph_inputs
    for meta in (dict(older, inputs=two), dict(digits.meta, inputs=two, graph_inputs=["image", "features"])):
        with_meta(digits.plain, tmp_path / "m.onnx", meta)
        # the graph has one input, its metadata two: refused as a damaged artifact before any input is read
        one_line_error(["predict", str(tmp_path / "m.onnx"), digits.pngs[0]], capsys,
                       "its trainforge metadata says ['image', 'features'] -> ['logits']")


def test_a_task_predict_does_not_know_names_the_module_to_import(digits, tmp_path, capsys):
    with_meta(digits.plain, tmp_path / "m.onnx", dict(digits.meta, task="radar", task_module="radar_tasks"))
    message = one_line_error(["predict", str(tmp_path / "m.onnx"), digits.pngs[0]], capsys,
                             "is a 'radar' model, a task not registered here")
    assert "--import radar_tasks" in message  # said, never done: predict imports nothing on an artifact's word
    assert "radar_tasks" not in sys.modules
    one_line_error(["predict", str(tmp_path / "m.onnx"), digits.pngs[0], "--import", "radar_tasks"], capsys,
                   "--import: cannot import module 'radar_tasks'")
    one_line_error(["predict", str(tmp_path / "m.onnx"), digits.pngs[0], "--import", "../evil"], capsys,
                   "--import: '../evil' is not a module name")


def test_a_graph_that_disagrees_with_its_metadata(digits, tmp_path, capsys):
    with_meta(digits.plain, tmp_path / "m.onnx", dict(digits.meta, outputs=["boxes", "scores"]))
    one_line_error(["predict", str(tmp_path / "m.onnx"), digits.pngs[0]], capsys,
                   "its trainforge metadata says ['input'] -> ['boxes', 'scores']")


def test_a_task_whose_own_serving_code_fails_is_one_line(digits, tmp_path, capsys, monkeypatch):
    """A task a module registers (--import) runs its own code on the outputs; when that code fails, one line says
    which task and where, not a traceback."""
    from trainforge.tasks import TASKS
    from trainforge.tasks.classification import Classification

    class Broken(Classification):
        name = "broken"

        def predictions(self, outputs, meta, *, top_k):
            return [{}["missing"] for _ in outputs.values()]

    monkeypatch.setitem(TASKS._entries, "broken", Broken())
    path = with_meta(digits.plain, tmp_path / "m.onnx", dict(digits.meta, task="broken"))
    message = one_line_error(["predict", str(path), digits.pngs[0]], capsys, "its task 'broken'")
    assert "failed in predictions: KeyError" in message and "test_predict.py:" in message


def test_a_pictures_file_is_named_after_its_input_and_two_inputs_of_one_name_keep_their_folders():
    """Issue 55: `street.jpg` -> `street.png`; `a/street.jpg` and `b/street.jpg` -> `a_street.png`, `b_street.png`;
    a scan's double suffix goes too (`ct0.nii.gz` -> `ct0.png`)."""
    from trainforge.compression.predict import picture_names

    inputs = ["a/street.jpg", "b/street.jpg", "frame.png", "/scans/ct0.nii.gz"]
    name_of = picture_names(inputs)
    assert [name_of(n, i) for i, n in enumerate(inputs)] == ["a_street.png", "b_street.png", "frame.png", "ct0.png"]
