"""Byte tokenizers, and token augmentation for text classification as a pure function of (seed, epoch, index)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainforge
from data_helpers import data_cfg
from trainforge.config import AugmentConfig
from trainforge.data import build_data
from trainforge.data.text import byte_level as text
from trainforge.data.stages.augment import MIN_WINDOW_TOKENS, build_text_augment
from trainforge.data.seeding import generator_for
from trainforge.errors import UserError

TEXT_AUGMENTS = {"token_crop": 0.6, "token_dropout": 0.2, "token_mask": 0.2}
WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "grim"]


def test_bytes_tokenizer_pads_truncates_and_round_trips():
    ids = text.encode("hé!", 6)
    assert ids == [ord("h") + 1, 0xC3 + 1, 0xA9 + 1, ord("!") + 1, 0, 0]
    assert text.decode(ids) == "hé!"
    assert text.encode("abcdef", 3) == [98, 99, 100]
    assert max(text.encode("\xff" * 4, 8)) < text.BYTES_VOCAB_SIZE


def test_raw_bytes_tokenizer():
    assert text.encode_raw("ab") == [97, 98]
    assert text.decode_raw([104, 105]) == "hi"


def write_reviews(path: Path, n: int = 200) -> Path:
    """n distinct texts of 30-60 bytes; label: whether 'good'-ish words dominate."""
    lines = []
    for i in range(n):
        words = [WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] for k in range(6 + i % 5)]
        label = "pos" if sum(w in ("good", "fine", "great", "nice") for w in words) * 2 >= len(words) else "neg"
        lines.append(json.dumps({"text": f"{i} " + " ".join(words), "label": label}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def reviews(tmp_path: Path) -> Path:
    return write_reviews(tmp_path / "reviews.jsonl")


def text_bundle(path: Path, **augment):
    return build_data(data_cfg("jsonl", path=str(path), args={"seq_len": 64}, augment=augment), seed=3)


def real_length(x: torch.Tensor, pad: int = 0) -> int:
    nz = torch.nonzero(x != pad)
    return int(nz[-1]) + 1 if len(nz) else 0


def test_text_augmentation_is_a_function_of_seed_epoch_index(reviews):
    bundle = text_bundle(reviews, **TEXT_AUGMENTS)
    rng_before = torch.get_rng_state()
    a = bundle.train[(2, 5)][0]
    assert torch.get_rng_state().equal(rng_before), "the global torch RNG must not be touched"
    torch.manual_seed(123)
    assert torch.equal(a, bundle.train[(2, 5)][0])
    assert torch.equal(a, text_bundle(reviews, **TEXT_AUGMENTS).train[(2, 5)][0]), "a rebuilt bundle (resume)"
    assert not torch.equal(a, bundle.train[(3, 5)][0]), "a new epoch must draw new augmentation"
    assert a.shape == (64,) and a.dtype == torch.int64


def test_val_test_and_int_indices_are_never_augmented(reviews):
    bundle, plain = text_bundle(reviews, **TEXT_AUGMENTS), text_bundle(reviews)
    assert plain.train.augment is None and bundle.train.augment is not None
    for split in ("val", "test"):
        a, b = getattr(bundle, split), getattr(plain, split)
        assert all(torch.equal(a[i][0], b[i][0]) for i in range(len(a)))
    assert torch.equal(bundle.train[4][0], plain.train[(0, 4)][0])
    raw = bundle.train.samples
    changed = sum(not torch.equal(bundle.train[(0, i)][0], raw[int(bundle.train.indices[i])][0]) for i in range(20))
    assert changed >= 18


def pairs(bundle, epochs=range(4)):
    """(augmented, original) token rows over every train sample and a few epochs."""
    raw = bundle.train.samples
    for epoch in epochs:
        for i in range(len(bundle.train)):
            yield bundle.train[(epoch, i)][0], raw[int(bundle.train.indices[i])][0]


def test_token_mask_hides_tokens_at_the_configured_rate(reviews):
    masked = total = 0
    for aug, orig in pairs(text_bundle(reviews, token_mask=0.2)):
        n = real_length(orig)
        assert torch.equal(aug[n:], orig[n:]) and aug.shape == orig.shape
        changed = aug[:n] != orig[:n]
        assert (aug[:n][changed] == text.PAD_ID).all(), "a masked token becomes the pad id; nothing else changes"
        masked, total = masked + int(changed.sum()), total + n
    assert total > 20_000 and masked / total == pytest.approx(0.2, abs=0.015)


def test_token_dropout_deletes_tokens_at_the_configured_rate(reviews):
    kept = total = 0
    for aug, orig in pairs(text_bundle(reviews, token_dropout=0.25)):
        n, m = real_length(orig), real_length(aug)
        it = iter(orig[:n].tolist())
        assert all(t in it for t in aug[:m].tolist()), "the survivors keep their order"
        assert (aug[m:] == text.PAD_ID).all()
        kept, total = kept + m, total + n
    assert 1 - kept / total == pytest.approx(0.25, abs=0.015)


def test_token_crop_keeps_one_window_of_at_least_the_fraction(reviews):
    lengths = []
    for aug, orig in pairs(text_bundle(reviews, token_crop=0.5), epochs=range(2)):
        n, m = real_length(orig), real_length(aug)
        assert max(-(-n // 2), min(n, MIN_WINDOW_TOKENS)) <= m <= n
        window = aug[:m].tolist()
        assert any(orig[s : s + m].tolist() == window for s in range(n - m + 1)), "a contiguous window"
        lengths.append(m / n)
    assert min(lengths) < 0.6 and max(lengths) == 1.0 and 0.7 < sum(lengths) / len(lengths) < 0.8


def test_short_and_empty_texts_stay_valid():
    aug = build_text_augment(AugmentConfig(token_crop=0.1, token_dropout=0.5, token_mask=0.5))
    empty = torch.zeros(8, dtype=torch.int64)
    assert torch.equal(aug(empty, generator_for("t")), empty)
    for i in range(200):
        out = aug(torch.tensor([5, 0, 0, 0]), generator_for("t", i))
        assert out.tolist() == [5, 0, 0, 0], "a one-token text is never dropped or masked away"
        out = aug(torch.arange(1, 7), generator_for("t", i))
        assert real_length(out) >= 1 and out.shape == (6,)
    assert build_text_augment(AugmentConfig(hflip=1.0)) is None


@pytest.mark.parametrize("override,field", [
    ("data.augment.token_dropout=0.6", "data.augment.token_dropout"),
    ("data.augment.token_mask=-0.1", "data.augment.token_mask"),
    ("data.augment.token_crop=0", "data.augment.token_crop"),
    ("data.augment.token_crop=1.5", "data.augment.token_crop"),
    ("data.augment.token_shuffle=0.1", "data.augment.token_shuffle"),
])
def test_text_augment_settings_are_validated(override, field):
    with pytest.raises(UserError, match=field):
        trainforge.load_config("textcls_transformer", [override])


def test_token_augmentation_is_ignored_with_a_warning_for_lm_and_images():
    lm = data_cfg("synthetic_text", args={"task": "lm", "num_samples": 20}, augment={"token_mask": 0.1})
    with pytest.warns(UserWarning, match=r"^data.augment.token_mask ignored: .*not language modelling"):
        assert build_data(lm, seed=0).train.augment is None
    images = data_cfg("synthetic_images", args={"num_samples": 20, "image_size": 4}, augment={"token_dropout": 0.1})
    with pytest.warns(UserWarning, match=r"^data.augment.token_dropout ignored: token augmentation applies to text"):
        assert build_data(images, seed=0).train.augment is None


def test_image_augmentation_on_text_warns_and_token_ops_still_apply(reviews):
    with pytest.warns(UserWarning, match=r"^data.augment.hflip ignored: image augmentation"):
        bundle = text_bundle(reviews, hflip=0.5, token_mask=0.1)
    assert bundle.train.augment is not None
    cfg = data_cfg("synthetic_text", args={"num_samples": 20}, augment={"token_mask": 0.3})
    synthetic = build_data(cfg, seed=0)
    assert not torch.equal(synthetic.train[(0, 0)][0], synthetic.train[0][0])


TINY_TEXT = [
    "data.source=jsonl", "data.args={seq_len: 64}", "data.val_fraction=0.1", "data.test_fraction=0.1",
    "data.augment={token_crop: 0.6, token_dropout: 0.1, token_mask: 0.1}",
    "model.name=custom", "model.target=text_models:signaling_bag",
    "train.global_batch_size=16", "train.micro_batch_size=16", "train.max_steps=10", "train.eval_every_steps=5",
    "train.checkpoint_every_steps=4", "train.early_stopping=null", "train.deterministic=true",
    "log.progress=false", "log.tensorboard=false", "log.report=false",
]


def test_text_classification_trains_with_augmentation_and_resumes_bit_exact(reviews, tmp_path, monkeypatch):
    """A SIGTERM during step 6 of 10 leaves a checkpoint; the resumed run ends bit-identical to an uninterrupted
    one, which needs the same augmented tokens after the resume."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    cfg = [*TINY_TEXT, f"data.path={reviews}"]
    full = trainforge.train(trainforge.load_config("textcls_transformer", [*cfg, "model.args={call: -1}"]),
                            run_dir=tmp_path / "full")
    assert full.status == "completed" and full.steps == 10
    report = json.loads((full.run_dir / "data_report.json").read_text())
    assert report["rows_kept"] == 200
    part = trainforge.train(trainforge.load_config("textcls_transformer", [*cfg, "model.args={call: 6}"]),
                            run_dir=tmp_path / "part")
    assert part.status == "interrupted" and part.steps == 6
    resumed = trainforge.train(None, overrides=["model.args={call: -1}"], run_dir=tmp_path / "part", resume="auto")
    assert resumed.status == "completed" and resumed.steps == 10
    a = load_file(str(full.run_dir / "final" / "model.safetensors"))
    b = load_file(str(resumed.run_dir / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_token_augmentation_pads_and_masks_with_the_datas_pad_id(tmp_path):
    """A model tokenizer pads with its own id (here 3, not the byte tokenizer's 0): masked tokens and the padding
    after a crop or a dropout use it, and 0 is an ordinary token that is kept."""
    from trainforge.data.base import DataInfo
    from trainforge.data.pipeline import choose_augment

    info = DataInfo(task="classification", modality="text", input_shape=(12,), input_dtype="int64", num_classes=2,
                    pad_id=3)
    aug = choose_augment(AugmentConfig(token_dropout=0.3, token_mask=0.3), info, (0.0, 1.0))
    x = torch.tensor([7, 0, 8, 9, 10, 0, 11, 12, 3, 3, 3, 3])
    outs = [aug(x, generator_for("pad", i)) for i in range(100)]
    for out in outs:
        n = real_length(out, pad=3)
        assert (out[n:] == 3).all() and out.shape == x.shape
        assert set(out[:n].tolist()) <= {7, 0, 8, 9, 10, 11, 12, 3}
    assert any(3 in out[:real_length(out, pad=3)].tolist() for out in outs), "some tokens are masked with 3"
    assert sum(real_length(out, pad=3) < 8 for out in outs) > 10, "dropout shortens the text, padded with 3"
    assert sum(out.tolist().count(0) == 2 for out in outs) > 10, "token 0 is text here: kept unless dropped"


def test_a_csv_or_tsv_of_texts_reads_as_its_jsonl(reviews, tmp_path):
    """A spreadsheet export (header row; quoted texts with commas, quotes and line breaks) gives the same samples
    as the JSONL of the same records; rows with the wrong number of cells or no text are dropped and counted."""
    import csv

    records = [json.loads(line) for line in reviews.read_text().splitlines()]
    records[0]["text"] = 'says "hi", then\na second line'
    reviews.write_text("".join(json.dumps(r) + "\n" for r in records))
    for suffix, delimiter in ((".csv", ","), (".tsv", "\t")):
        table = tmp_path / f"reviews{suffix}"
        with table.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter=delimiter)
            writer.writerow(["id", "label", "review"])
            writer.writerows([i, r["label"], r["text"]] for i, r in enumerate(records))
            writer.writerow([999, "pos"])                  # a cell short: corrupt
            writer.writerow([1000, "pos", "   "])          # no text: empty_text
        args = {"seq_len": 64, "text_field": "review"}
        a = build_data(data_cfg("jsonl", path=str(reviews), args={"seq_len": 64}), seed=3)
        b = build_data(data_cfg("jsonl", path=str(table), args=args), seed=3)
        assert b.info == a.info
        assert torch.equal(torch.stack([b.train[i][0] for i in range(len(b.train))]),
                           torch.stack([a.train[i][0] for i in range(len(a.train))]))
        assert {k: v for k, v in b.report["dropped"].items() if v} == {"corrupt": 1, "empty_text": 1}
    with pytest.raises(UserError, match=r"no row of .* has a text in column 'text'.*data.args.text_field"):
        build_data(data_cfg("jsonl", path=str(table), args={"seq_len": 64}), seed=3)
