"""`trainforge compress` and `trainforge predict` on the pretrained-model families (issue 14), each trained once
for the module: transformers (`model.name: hf`) as a text classifier (a tiny BERT on jsonl, the byte tokenizer)
and as an image classifier (a tiny ViT), and timm (`model.name: timm`, test_resnet), both on a generated
imagefolder with the default normalization.

The fp32 ONNX and int8 artifacts, served by `predict` from the files, give the torch model's predictions on
the test split; the attention mask HFModel derives from the pad id is part of the exported graph; timm models
prune (convolutions, Mlp widths), transformers models skip pruning with one line and still get every other
variant. Nothing downloads (HF_HUB_OFFLINE=1, tests/conftest.py).
"""
from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

import trainforge
from trainforge.cli import main
from trainforge.compression import bench
from trainforge.compression.prune import PruningUnsupported, prune_model
from trainforge.compression.pipeline import torch_logits
from trainforge.data import build_data
from trainforge.training.artifacts import load_trained

QUIET = ["log.progress=false", "log.tensorboard=false", "train.early_stopping=null", "schedule.warmup_steps=0",
         "train.global_batch_size=32", "train.micro_batch_size=32", "train.num_threads=1"]
# fast compression: little timing, a small calibration set
FAST = ["--bench-seconds", "0.01", "--calibration-samples", "64", "--json"]
SEQ_LEN = 32
TINY_BERT = dict(model_type="bert", vocab_size=257, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=SEQ_LEN)
TINY_VIT = dict(model_type="vit", image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=64)
KEYWORDS = {"neg": ["awful", "boring", "dull"], "neu": ["okay", "average", "plain"], "pos": ["great", "lovely", "superb"]}
FILLER = ["the", "movie", "was", "really", "plot", "actors", "and", "quite", "a", "film", "so"]


def cli(args: list[str]) -> tuple[int, str, str]:
    """`trainforge ARGS`: (exit code, stdout, stderr); usable in module fixtures (no capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code or 0, out.getvalue(), err.getvalue()


def compressed(run_dir: Path, *flags: str) -> tuple[dict, str]:
    code, out, err = cli(["compress", str(run_dir), *flags, *FAST])
    assert code == 0 and "Traceback" not in err, err
    return json.loads(out), err


def split_of(trained) -> tuple[object, np.ndarray]:
    """The run's test split, and its inputs as one array, the way compress and eval read them."""
    cfg = trained.config
    split = build_data(cfg.data, seed=cfg.seed, stored=trained.preprocess).test
    return split, torch.stack([split[i][0] for i in range(len(split))]).numpy()


def served_indices(artifact: Path, inputs: list[str], variant: str) -> list[int]:
    code, out, err = cli(["predict", str(artifact), *inputs, "--variant", variant, "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["variant"] == variant
    return [p["index"] for p in doc["predictions"]]


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> SimpleNamespace:
    """A tiny BERT trained on keyword-labelled reviews, compressed with --prune 0.5 (which it skips)."""
    root = tmp_path_factory.mktemp("bert")
    rng = random.Random(0)
    rows = []
    for i in range(600):
        label = ["neg", "neu", "pos"][i % 3]
        words = [rng.choice(KEYWORDS[label]) for _ in range(rng.randint(1, 3))] + rng.choices(FILLER, k=rng.randint(0, 3))
        rng.shuffle(words)
        rows.append({"text": " ".join(words) + f" {i}", "label": label})  # lengths vary: padding varies
    (root / "reviews.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = trainforge.load_config(None, [
        "data.source=jsonl", f"data.path={root / 'reviews.jsonl'}", f"data.args={{seq_len: {SEQ_LEN}}}",
        "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "model.name=hf",
        f"model.args={{pretrained: false, config: {TINY_BERT}}}", "train.epochs=10", "optim.lr=0.005", *QUIET])
    run = trainforge.train(cfg, run_dir=root / "run")
    doc, err = compressed(run.run_dir, "--prune", "0.5")
    trained = load_trained(run.run_dir)
    split, inputs = split_of(trained)
    texts = [rows[int(split.samples.ids[int(i)].removeprefix("line ")) - 1]["text"] for i in split.indices]
    (root / "test.txt").write_text("\n".join(texts) + "\n")
    model = trained.build_model().eval()
    return SimpleNamespace(run=run, doc=doc, err=err, out=Path(doc["out"]), model=model, inputs=inputs,
                           labels=[int(split[i][1]) for i in range(len(split))],
                           expected=torch_logits(model, inputs).argmax(1).tolist(), lines=root / "test.txt")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """An imagefolder of 20x20 RGB PNGs whose class is their dominant colour."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c, name in enumerate(("red", "green", "blue")):
        (root / name).mkdir()
        for i in range(80):
            pixels = rng.integers(0, 130, (20, 20, 3)).astype(np.uint8)
            pixels[..., c] += rng.integers(60, 126, dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def image_run(root: Path, images: Path, model: list[str], *flags: str) -> SimpleNamespace:
    """Train MODEL on `images`, compress the run with FLAGS; the torch model's test-split predictions."""
    cfg = trainforge.load_config(None, ["data.source=imagefolder", f"data.path={images}", "data.args={image_size: 16}",
                                        *model, *QUIET])
    run = trainforge.train(cfg, run_dir=root / "run")
    doc, err = compressed(run.run_dir, *flags)
    trained = load_trained(run.run_dir)
    split, inputs = split_of(trained)
    model = trained.build_model().eval()
    return SimpleNamespace(run=run, doc=doc, err=err, out=Path(doc["out"]), model=model, inputs=inputs,
                           labels=[int(split[i][1]) for i in range(len(split))],
                           expected=torch_logits(model, inputs).argmax(1).tolist(),
                           paths=[str(split.samples.paths[int(i)]) for i in split.indices])


@pytest.fixture(scope="module")
def resnet(tmp_path_factory, images) -> SimpleNamespace:
    """timm's test_resnet, compressed with --prune 0.5 and 1 epoch of fine-tuning."""
    return image_run(tmp_path_factory.mktemp("resnet"), images, ["model.name=timm", "model.args={arch: test_resnet}",
                     "train.epochs=3"], "--prune", "0.5", "--finetune-epochs", "1")


@pytest.fixture(scope="module")
def hf_vit(tmp_path_factory, images) -> SimpleNamespace:
    """A tiny transformers ViT (an hf image classifier), compressed with --prune 0.5 (which it skips)."""
    return image_run(tmp_path_factory.mktemp("vit"), images, ["model.name=hf", f"model.args={{pretrained: false, "
                     f"config: {TINY_VIT}}}", "train.epochs=3"], "--prune", "0.5")


def agreement(a: list[int], b: list[int]) -> float:
    assert len(a) == len(b) and a
    return float(np.mean(np.asarray(a) == np.asarray(b)))


def variants(doc: dict) -> dict[str, dict]:
    return {v["name"]: v for v in doc["variants"]}


# ---- transformers (model.name: hf) -------------------------------------------------------------------------


def test_an_hf_text_classifier_gets_fp32_and_int8_and_one_line_saying_pruning_does_not_apply(bert):
    rows = variants(bert.doc)
    assert sorted(rows) == ["fp32", "int8"] and (bert.out / "fp32.onnx").is_file() and (bert.out / "int8.onnx").is_file()
    assert bert.doc["int8_method"] == "dynamic"  # Linear-heavy
    assert rows["fp32"]["max_abs_diff"] < 1e-4 and rows["int8"]["bytes"] < rows["fp32"]["bytes"] / 2
    assert rows["fp32"]["accuracy"] == pytest.approx(bert.run.eval["accuracy"])  # the ONNX file scores as eval did
    skipped = [line for line in bert.err.splitlines() if "pruning is not supported" in line]
    assert len(skipped) == 1 and "model.name: hf" in skipped[0] and "smaller" in skipped[0]
    assert "Traceback" not in bert.err and "Evaluation failed" not in bert.err
    assert bert.doc["pruning"]["skipped"] in skipped[0] and not (bert.out / "pruned.onnx").exists()
    assert abs(rows["int8"]["accuracy_delta_pt"]) <= 2.0
    assert "Pruning skipped: --prune: pruning is not supported" in (bert.run.run_dir / "report.html").read_text()


def test_predict_on_the_hf_text_classifier_agrees_with_torch(bert):
    assert agreement(bert.expected, bert.labels) >= 0.8  # the model learned the task: agreement is not vacuous
    for variant in ("fp32", "int8"):
        served = served_indices(bert.out, [str(bert.lines)], variant)
        assert agreement(served, bert.expected) >= 0.99, variant


def test_the_exported_graph_masks_the_pad_id_like_the_torch_model(bert):
    """Logits of heavily padded inputs equal torch's, and torch's on the unpadded tokens: padding is not attended."""
    session = bench.ort_session(bert.out / "fp32.onnx", threads=1)
    x = torch.from_numpy(bert.inputs[:4].copy())
    x[:, 6:] = 0  # the byte tokenizer's pad id
    got = bench.run(session, x.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(got, bert.model(x).numpy(), atol=1e-5)
        np.testing.assert_allclose(got, bert.model.model(input_ids=x[:, :6]).logits.numpy(), atol=1e-5)
        unmasked = bert.model.model(input_ids=x, attention_mask=torch.ones_like(x)).logits.numpy()
    assert np.abs(got - unmasked).max() > 1e-3  # the mask changes the answer, so the check above means something
    full = np.random.default_rng(0).integers(1, 257, (3, SEQ_LEN))  # no padding at all, another batch size
    np.testing.assert_allclose(bench.run(session, full), torch_logits(bert.model, full), atol=1e-5)


# ---- timm (model.name: timm) -------------------------------------------------------------------------------


def test_a_timm_convnet_gets_all_four_variants_pruned_for_real(resnet):
    rows = variants(resnet.doc)
    assert sorted(rows) == ["fp32", "int8", "pruned", "pruned+int8"]
    assert resnet.doc["int8_method"] == "static"  # conv-heavy
    assert rows["pruned"]["params"] < rows["fp32"]["params"] / 2 and rows["pruned"]["flops"] < rows["fp32"]["flops"]
    assert rows["fp32"]["max_abs_diff"] < 1e-4 and rows["int8"]["bytes"] < rows["fp32"]["bytes"] / 2
    assert rows["fp32"]["accuracy"] == pytest.approx(resnet.run.eval["accuracy"])
    assert resnet.doc["finetune"]["steps"] > 0 and "Traceback" not in resnet.err


def test_predict_on_the_timm_image_classifier_agrees_with_torch(resnet):
    assert agreement(resnet.expected, resnet.labels) >= 0.8
    for variant in ("fp32", "int8"):
        served = served_indices(resnet.out, resnet.paths, variant)
        assert agreement(served, resnet.expected) >= 0.99, variant


def test_an_hf_image_classifier_gets_dynamic_int8_and_serves_the_torch_predictions(hf_vit):
    rows = variants(hf_vit.doc)
    assert sorted(rows) == ["fp32", "int8"] and "pruning is not supported" in hf_vit.doc["pruning"]["skipped"]
    assert hf_vit.doc["int8_method"] == "dynamic"  # a patch-embedding Conv, but Linear-heavy
    assert agreement(hf_vit.expected, hf_vit.labels) >= 0.8
    for variant in ("fp32", "int8"):
        served = served_indices(hf_vit.out, hf_vit.paths, variant)
        assert agreement(served, hf_vit.expected) >= 0.99, variant


def test_timm_transformers_prune_their_mlp_width_and_what_torch_pruning_cannot_follow_is_one_line():
    import timm

    x = torch.randn(2, 3, 32, 32)
    vit = timm.create_model("test_vit", num_classes=3, img_size=32).eval()
    result = prune_model(vit, x, 0.5)  # timm's Mlp hidden width, like the zoo's FeedForward
    assert result.params_after < result.params_before and result.model(x).shape == (2, 3)
    assert all(b.mlp.fc1.out_features == vit.blocks[0].mlp.fc1.out_features // 2 for b in result.model.blocks)
    with pytest.raises(PruningUnsupported, match="torch-pruning cannot prune NormFreeNet consistently") as exc:
        prune_model(timm.create_model("test_nfnet", num_classes=3).eval(), x, 0.5)
    assert "\n" not in str(exc.value) and "pruning skipped" in str(exc.value)
