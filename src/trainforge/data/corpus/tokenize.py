"""How the pipeline tokenizes text: which tokenizer (`choose_tokenizer`: the stored one, the model's, or a BPE trained
on the train split; `corpus_tokenizer` for a corpus: trained once per corpus), and the text samples before and after.

    pool = tokenize_corpus(pool, cfg, stored)     # TextCorpus -> TokenWindows over its token shards (before the split)
    pool = tokenize_texts(pool, tok)              # TextSamples -> TensorSamples of token ids (after the split)

The byte tokenizers need no choosing: a jsonl source encodes its texts with `byte_level.encode` itself, and a corpus
without `data.tokenizer: model | bpe` is shards of raw bytes (`codec.RawBytes`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from trainforge.config import DataConfig
from trainforge.data.formats.token_shards import BPE_TRAIN_MAX_BYTES, Corpus, TokenShards, prepare_shards, trained_once
from trainforge.data.pool import Pool, Samples, TensorSamples
from trainforge.data.stages.clean import clean_text_pool
from trainforge.data.text.byte_level import RAW_BYTES_VOCAB_SIZE
from trainforge.data.text.codec import RawBytes, Subword
from trainforge.data.text.tokenizer import TextTokenizer, is_stored, pretrained_tokenizer, tokenizer_note, train_bpe
from trainforge.errors import UserError


class TextSamples(Samples):
    """Texts with their labels before tokenization (`data.tokenizer: model | bpe`): the pipeline splits them,
    fits the tokenizer on the train part, and turns them into `TensorSamples` of token ids."""

    def __init__(self, texts: list[str], y: torch.Tensor, ids: list[str], seq_len: int) -> None:
        assert len(texts) == len(y) == len(ids), (len(texts), len(y), len(ids))
        self.texts, self.y, self.ids, self.seq_len = texts, y, ids, seq_len

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError("TextSamples are tokenized by the pipeline before they are read")

    def subset(self, keep: np.ndarray) -> "TextSamples":
        return TextSamples([self.texts[i] for i in keep], self.y[torch.as_tensor(keep, dtype=torch.long)],
                           [self.ids[i] for i in keep], self.seq_len)

    def before_split(self, pool: Pool, cfg: DataConfig, stored: Optional[dict[str, Any]]) -> Pool:
        return clean_text_pool(pool, cfg.clean)  # duplicate texts dropped

    def after_split(self, pool: Pool, splits: dict[str, np.ndarray], cfg: DataConfig,
                    stored: Optional[dict[str, Any]]) -> tuple[Pool, dict[str, np.ndarray]]:
        texts = self.texts
        return tokenize_texts(pool, choose_tokenizer(cfg, lambda: [texts[i] for i in splits["train"]], stored)), splits


class TextCorpus(Samples):
    """A language-modelling corpus before tokenization: `corpus` says what to read (data/formats/token_shards.py: text
    files, or the text column of data files); the pipeline tokenizes it once into memory-mapped token shards and cuts
    `block_size + 1` windows (`tokenize_corpus`)."""

    def __init__(self, corpus: Corpus, block_size: int) -> None:
        self.corpus, self.block_size = corpus, block_size

    def __len__(self) -> int:
        return 0  # no sample before it is tokenized

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError("a TextCorpus is tokenized by the pipeline before it is read")

    def before_split(self, pool: Pool, cfg: DataConfig, stored: Optional[dict[str, Any]]) -> Pool:
        return tokenize_corpus(pool, cfg, stored)  # the windows exist only once the corpus is tokenized


class TokenWindows(Samples):
    """Windows of block_size + 1 tokens over token shards, read on demand: the corpus is never in memory."""

    def __init__(self, shards: TokenShards, block_size: int) -> None:
        self.shards, self.block_size = shards, block_size

    def __len__(self) -> int:
        return self.shards.tokens // (self.block_size + 1)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(index)
        n = self.block_size + 1
        w = torch.from_numpy(self.shards.read(index * n, (index + 1) * n))
        return w[:-1], w[1:]


def choose_tokenizer(cfg: DataConfig, train_texts: Callable[[], Iterable[str]],
                     stored: Optional[dict[str, Any]]) -> TextTokenizer:
    """The stored tokenizer when there is one, else data.tokenizer's: the model's, or a BPE trained on the train
    split (`train_texts` is called only then)."""
    if is_stored(stored):
        return TextTokenizer.from_preprocess(stored)
    if cfg.tokenizer == "model":
        assert cfg.from_model is not None  # Config fills it from the model section
        if cfg.from_model.family != "hf":
            raise UserError(f"data.tokenizer: model needs a transformers model; data.from_model is a "
                            f"{cfg.from_model.family} model (images); use bpe or bytes", public=True)
        return pretrained_tokenizer(cfg.from_model.source, "data.from_model.source", cfg.from_model.trust_remote_code)
    a = cfg.tokenizer_args
    return train_bpe(train_texts(), vocab_size=a.vocab_size, min_frequency=a.min_frequency)


def tokenize_texts(pool: Pool, tok: TextTokenizer) -> Pool:
    """TextSamples -> TensorSamples of (seq_len,) token ids; info gets the tokenizer's vocabulary and padding."""
    samples = pool.samples
    x = torch.from_numpy(tok.encode_fixed(samples.texts, samples.seq_len))
    full = int((x[:, -1] != tok.pad_id).sum())  # the last position holds a token: (at least) filled, likely cut
    pool.samples = TensorSamples(x, samples.y, samples.ids)
    pool.info = replace(pool.info, vocab_size=tok.vocab_size, pad_id=tok.pad_id)
    pool.preprocess = {**pool.preprocess, **tok.to_preprocess()}
    pool.notes = {**pool.notes, "tokenizer": tokenizer_note(tok, {"texts_filling_seq_len": full})}
    return pool


def tokenize_corpus(pool: Pool, cfg: DataConfig, stored: Optional[dict[str, Any]]) -> Pool:
    """TextCorpus -> windows read from its token shards (data/formats/token_shards.py: tokenized once per corpus and
    tokenizer, reused by every later run; no copy of the corpus in this process)."""
    text = pool.samples
    tok = corpus_tokenizer(cfg, text.corpus, stored)
    index = prepare_shards(text.corpus, RawBytes() if tok is None else Subword.of(tok))
    windows = TokenWindows(TokenShards(index), text.block_size)
    if len(windows) == 0:
        raise UserError(f"data.path: the corpus has {index.tokens} tokens, less than one window of data.args.block_size "
                        f"+ 1 = {text.block_size + 1}; lower data.args.block_size or add text", public=True)
    vocab = RAW_BYTES_VOCAB_SIZE if tok is None else tok.vocab_size
    pool.samples, pool.rows_read = windows, len(windows)
    pool.info = replace(pool.info, num_classes=vocab, vocab_size=vocab)
    pool.preprocess = {**pool.preprocess, **({"tokenizer": "raw_bytes", "vocab_size": vocab} if tok is None
                                             else tok.to_preprocess())}
    pool.notes = {**pool.notes, "corpus_files": index.corpus_files, "corpus_bytes": index.corpus_bytes,
                  "token_shards": index.summary()}
    if tok is not None:
        pool.notes["tokenizer"] = tokenizer_note(tok, {"corpus_tokens": index.tokens})
    return pool


def corpus_tokenizer(cfg: DataConfig, corpus: Corpus, stored: Optional[dict[str, Any]]) -> Optional[TextTokenizer]:
    """None for raw bytes; else the stored tokenizer, the model's, or a BPE trained once per corpus on the text the
    contiguous split trains on (its leading share) and reused from then on."""
    if not is_stored(stored) and cfg.tokenizer not in ("model", "bpe"):
        return None
    share = 1 - cfg.val_fraction - cfg.test_fraction
    choose = lambda: choose_tokenizer(cfg, lambda: corpus.train_texts(share), stored)  # noqa: E731
    if is_stored(stored) or cfg.tokenizer == "model":
        return choose()
    settings = {"bpe": cfg.tokenizer_args.model_dump(), "train_share": share, "max_bytes": BPE_TRAIN_MAX_BYTES}
    return trained_once(corpus, settings, choose)
