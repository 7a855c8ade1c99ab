"""Honest evidence that pretrained weights are used: a tiny BERT that trainforge pretrains on one task (which of
4 topics a text is about), saved in Hugging Face format (final/hf/), fine-tunes a related task (topics 0-1 or
2-3?) from 60 labelled texts in 20 steps far better than the same architecture from random weights."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import trainforge

BERT = dict(model_type="bert", vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, max_position_embeddings=160)
COMMON = ["data.source=jsonl", "data.args={seq_len: 144}", "data.normalize=none", "data.augment.rotation_deg=0",
          "data.augment.crop_scale=null", "train.early_stopping=null", "log.progress=false", "log.tensorboard=false", "log.report=false",
          "model.name=hf", "schedule.warmup_steps=10", "optim.lr=1e-3", "train.deterministic=true"]


def write_topics(path: Path, n: int, seed: int, label) -> Path:
    """Texts of 24 five-letter words, about a third of them from the text's topic (4 topics of 12 words, fixed),
    the rest from 150 shared filler words."""
    vocab = random.Random(0)
    word = lambda: "".join(vocab.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5))  # noqa: E731
    topics = [[word() for _ in range(12)] for _ in range(4)]
    filler = [word() for _ in range(150)]
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            k = rng.randrange(4)
            words = [rng.choice(topics[k]) if rng.random() < 0.35 else rng.choice(filler) for _ in range(24)]
            f.write(json.dumps({"text": " ".join(words), "label": label(k)}) + "\n")
    return path


@pytest.mark.slow
def test_a_pretrained_encoder_fine_tunes_at_least_10_points_better_than_random_weights(tmp_path):
    pretrain = write_topics(tmp_path / "pretrain.jsonl", 800, seed=1, label=lambda k: f"topic{k}")
    target = write_topics(tmp_path / "target.jsonl", 200, seed=2, label=lambda k: "ab" if k < 2 else "cd")
    base = trainforge.train(trainforge.load_config(None, [
        *COMMON, f"data.path={pretrain}", f"model.args={{pretrained: false, config: {BERT}}}", "train.max_steps=100",
        "train.global_batch_size=32", "train.micro_batch_size=32"]), run_dir=tmp_path / "pretrain")
    few = [*COMMON, f"data.path={target}", "data.val_fraction=0.1", "data.test_fraction=0.6", "train.max_steps=20",
           "train.global_batch_size=16", "train.micro_batch_size=16"]
    pretrained = trainforge.train(trainforge.load_config(None, [
        *few, f"model.args={{pretrained: {base.run_dir / 'final' / 'hf'}}}"]), run_dir=tmp_path / "pretrained")
    scratch = trainforge.train(trainforge.load_config(None, [
        *few, f"model.args={{pretrained: false, config: {BERT}}}"]), run_dir=tmp_path / "scratch")
    assert pretrained.eval["num_samples"] == scratch.eval["num_samples"] >= 100  # the same held-out texts
    assert pretrained.eval["accuracy"] >= scratch.eval["accuracy"] + 0.10, (pretrained.eval["accuracy"],
                                                                           scratch.eval["accuracy"])
