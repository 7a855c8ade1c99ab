"""`synthetic_images` and `synthetic_text`: learnable data generated lazily, per index, from the seed.

Sample i is a pure function of (seed, i), so an ImageNet-shaped (3x224x224, 1000 classes) or
GPT-2-shaped (seq 1024, vocab 50257) dataset costs only its label array in memory.
"""
from __future__ import annotations

from typing import Literal, Optional

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from trainforge.config import DataConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.data.pool import Pool, Samples
from trainforge.data.seeding import derive_seed, generator_for
from trainforge.data.sources.common import SOURCES, SourceArgs, parse_args

PROTOTYPE_SIZE = 4  # class patterns are smooth: a 4x4 random image per class, upsampled
TOPIC_TOKENS = 32  # tokens each text class favours
TOPIC_PROB = 0.5  # chance a token comes from its class's topic tokens
LM_NOISE_PROB = 0.1  # chance a token breaks the Markov chain


def seeded_labels(tag: str, seed: int, num_samples: int, num_classes: int) -> np.ndarray:
    rng = np.random.default_rng(derive_seed(tag, "labels", seed))
    return rng.integers(0, num_classes, num_samples, dtype=np.int64)


class SyntheticImages(Samples):
    """Sample i: clamp(0.5 + 0.25 * prototype[class] + 0.2 * noise, 0, 1), float32 (C, S, S)."""

    def __init__(self, num_samples: int, image_size: int, channels: int, num_classes: int, seed: int) -> None:
        self.image_size, self.seed = image_size, seed
        self.labels = seeded_labels("synthetic_images", seed, num_samples, num_classes)
        g = generator_for("synthetic_images", "prototypes", seed)
        self.prototypes = torch.randn(num_classes, channels, PROTOTYPE_SIZE, PROTOTYPE_SIZE, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = int(self.labels[index])
        size = self.image_size
        pattern = F.interpolate(self.prototypes[label : label + 1], size=(size, size), mode="bilinear")[0]
        g = generator_for("synthetic_images", self.seed, index)
        noise = torch.randn(pattern.shape, generator=g)
        x = (0.5 + 0.25 * pattern + 0.2 * noise).clamp_(0, 1)
        return x, torch.tensor(label)


class SyntheticTextClasses(Samples):
    """Sample i: tokens drawn half from its class's topic tokens, half uniformly; int64 (T,)."""

    def __init__(self, num_samples: int, seq_len: int, vocab_size: int, num_classes: int, seed: int) -> None:
        self.seq_len, self.vocab_size, self.seed = seq_len, vocab_size, seed
        self.labels = seeded_labels("synthetic_text", seed, num_samples, num_classes)
        g = generator_for("synthetic_text", "topics", seed)
        self.topics = torch.randint(0, vocab_size, (num_classes, min(TOPIC_TOKENS, vocab_size)), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        label = int(self.labels[index])
        topic = self.topics[label]
        g = generator_for("synthetic_text", self.seed, index)
        from_topic = torch.rand(self.seq_len, generator=g) < TOPIC_PROB
        topical = topic[torch.randint(0, len(topic), (self.seq_len,), generator=g)]
        uniform = torch.randint(0, self.vocab_size, (self.seq_len,), generator=g)
        return torch.where(from_topic, topical, uniform), torch.tensor(label)


class SyntheticMarkovText(Samples):
    """Sample i: a chain next = perm[token], broken by a random token with probability LM_NOISE_PROB.

    Returns (x, y) = (w[:-1], w[1:]) of a window w of seq_len + 1 tokens; a bigram model learns it.
    """

    def __init__(self, num_samples: int, seq_len: int, vocab_size: int, seed: int) -> None:
        self.num_samples, self.seq_len, self.vocab_size, self.seed = num_samples, seq_len, vocab_size, seed
        self.successor = torch.randperm(vocab_size, generator=generator_for("synthetic_text", "chain", seed)).numpy()

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.seq_len + 1
        g = generator_for("synthetic_text", self.seed, index)
        noisy = (torch.rand(n, generator=g) < LM_NOISE_PROB).tolist()
        random_tokens = torch.randint(0, self.vocab_size, (n,), generator=g).tolist()
        window = [random_tokens[0]]
        for t in range(1, n):  # sequential by nature; plain ints keep it ~0.1 ms per 1k tokens
            window.append(random_tokens[t] if noisy[t] else int(self.successor[window[-1]]))
        w = torch.tensor(window, dtype=torch.int64)
        return w[:-1], w[1:]


class SyntheticImagesArgs(SourceArgs):
    num_samples: int = Field(1024, gt=0)
    image_size: int = Field(32, gt=0)
    channels: int = Field(3, gt=0)
    num_classes: int = Field(10, gt=1)


class SyntheticTextArgs(SourceArgs):
    task: Optional[Literal["classification", "lm"]] = None  # None: the recipe's `task:`, else classification
    num_samples: int = Field(1024, gt=0)
    seq_len: int = Field(64, gt=0)
    vocab_size: int = Field(256, gt=1)
    num_classes: int = Field(4, gt=1)


@SOURCES.register("synthetic_images")
def synthetic_images(cfg: DataConfig, *, seed: int) -> Pool:
    """Class-patterned noisy images in [0, 1]; args num_samples, image_size, channels, num_classes."""
    a = parse_args(SyntheticImagesArgs, cfg)
    samples = SyntheticImages(a.num_samples, a.image_size, a.channels, a.num_classes, seed)
    names = tuple(str(c) for c in range(a.num_classes))
    shape = (a.channels, a.image_size, a.image_size)
    info = DataInfo("classification", "image", shape, "float32", a.num_classes, names)
    return Pool(
        info,
        samples,
        labels=samples.labels,
        rows_read=len(samples),
        preprocess={"image_size": a.image_size, "channels": a.channels},
    )


@SOURCES.register("synthetic_text")
def synthetic_text(cfg: DataConfig, *, seed: int) -> Pool:
    """Token sequences; task classification (topic tokens per class) or lm (Markov chain)."""
    a = parse_args(SyntheticTextArgs, cfg)
    task = a.task or cfg.task or DEFAULT_TEXT_TASK
    if task not in TEXT_TASKS:
        raise UserError(f"task: data.source synthetic_text makes {' or '.join(TEXT_TASKS)} data, not {task}")
    return TEXT_TASKS[task](a, seed)


def _markov_text(a: SyntheticTextArgs, seed: int) -> Pool:
    lm = SyntheticMarkovText(a.num_samples, a.seq_len, a.vocab_size, seed)
    info = DataInfo("lm", "text", (a.seq_len,), "int64", a.vocab_size, (), a.vocab_size, a.seq_len)
    return Pool(info, lm, labels=None, rows_read=len(lm), preprocess=_text_preprocess(a))


def _text_preprocess(a: SyntheticTextArgs) -> dict:
    return {"tokenizer": "none", "vocab_size": a.vocab_size, "seq_len": a.seq_len}


def _topic_text(a: SyntheticTextArgs, seed: int) -> Pool:
    samples = SyntheticTextClasses(a.num_samples, a.seq_len, a.vocab_size, a.num_classes, seed)
    names = tuple(str(c) for c in range(a.num_classes))
    info = DataInfo(
        "classification", "text", (a.seq_len,), "int64", a.num_classes, names, a.vocab_size, a.seq_len
    )
    return Pool(info, samples, labels=samples.labels, rows_read=len(samples), preprocess=_text_preprocess(a))


TEXT_TASKS = {"classification": _topic_text, "lm": _markov_text}  # the tasks synthetic_text generates data for
DEFAULT_TEXT_TASK = "classification"
