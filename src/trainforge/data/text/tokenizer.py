"""Subword tokenizers for text data, stored with the run: `data.tokenizer: model` and `data.tokenizer: bpe`.

    tok = train_bpe(train_texts, vocab_size=8000, min_frequency=2)   # or pretrained_tokenizer("bert-base-uncased")
    ids = tok.encode_fixed(texts, seq_len=128)       # (N, 128) int64: special tokens, truncated, padded with pad_id
    ids = tok.encode_stream(text)                    # language modelling: no special tokens, no padding
    pre = tok.to_preprocess()                        # JSON-able; kept in model.json, checkpoints and ONNX metadata
    tok = TextTokenizer.from_preprocess(pre)         # eval, predict, compress and resume: the stored one

A tokenizer travels as the text of its files (`tokenizer.json`, and for a pretrained one its
`tokenizer_config.json` and friends): the `tokenizers` library reads tokenizer.json alone, so `predict`
encodes with exactly the training tokenizer without torch or transformers, and `final/hf/` gets the files as
they came. This module imports only `tokenizers` and numpy; `pretrained_tokenizer` imports transformers.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from trainforge.errors import UserError

BPE_SPECIAL_TOKENS = ("<pad>", "<eos>")  # ids 0 and 1: padding 0 as for the byte tokenizer
TOKENIZER_FILE = "tokenizer.json"
SLOW_TOKENIZER_FILES = ("vocab.json", "vocab.txt", "merges.txt")  # tokenizer.json holds all of it for the fast one
ENCODE_CHUNK = 4096  # texts per encode_batch call (bounded memory, still parallel inside `tokenizers`)


@dataclass(frozen=True)
class TextTokenizer:
    kind: str  # "model" (a pretrained model's) or "bpe" (trained on this data)
    files: dict[str, str]  # file name -> text; tokenizer.json always
    pad_id: int
    eos_id: Optional[int]
    origin: str  # where it came from: the model's id or directory, or "trained on the training split"
    backend: Tokenizer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        backend = Tokenizer.from_str(self.files[TOKENIZER_FILE])
        backend.no_padding()
        backend.no_truncation()
        object.__setattr__(self, "backend", backend)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode_fixed(self, texts: Sequence[str], seq_len: int) -> np.ndarray:
        """(N, seq_len) int64: with the tokenizer's special tokens ([CLS] ... [SEP]), truncated to seq_len
        (special tokens kept) and right-padded with pad_id."""
        backend = Tokenizer.from_str(self.files[TOKENIZER_FILE])
        backend.enable_truncation(max_length=seq_len)
        backend.enable_padding(length=seq_len, pad_id=self.pad_id, pad_token=self.backend.id_to_token(self.pad_id) or "")
        out = np.empty((len(texts), seq_len), dtype=np.int64)
        for start in range(0, len(texts), ENCODE_CHUNK):
            encoded = backend.encode_batch(list(texts[start : start + ENCODE_CHUNK]))
            out[start : start + len(encoded)] = [e.ids for e in encoded]
        return out

    def encode_stream(self, texts: Iterable[str]) -> np.ndarray:
        """One int64 stream of every text's tokens (no special tokens), each text followed by eos_id if any."""
        parts: list[np.ndarray] = []
        batch: list[str] = []

        def flush() -> None:
            for e in self.backend.encode_batch(batch, add_special_tokens=False):
                parts.append(np.asarray(e.ids + ([] if self.eos_id is None else [self.eos_id]), dtype=np.int64))
            batch.clear()

        for text in texts:
            batch.append(text)
            if len(batch) == ENCODE_CHUNK:
                flush()
        flush()
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=True)

    def to_preprocess(self) -> dict[str, Any]:
        return {"tokenizer": self.kind, "tokenizer_files": dict(self.files), "pad_id": self.pad_id,
                "eos_id": self.eos_id, "tokenizer_origin": self.origin, "vocab_size": self.vocab_size}

    @classmethod
    def from_preprocess(cls, pre: dict[str, Any]) -> "TextTokenizer":
        return cls(pre["tokenizer"], dict(pre["tokenizer_files"]), int(pre["pad_id"]),
                   None if pre.get("eos_id") is None else int(pre["eos_id"]), str(pre.get("tokenizer_origin", "")))

    def save(self, directory: Path) -> None:
        """The tokenizer's files into `directory` (final/hf/ of an hf model: AutoTokenizer loads them)."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in self.files.items():
            (directory / name).write_text(text, encoding="utf-8")


def save_tokenizer(pre: Optional[dict[str, Any]], directory: Path) -> None:
    """The stored tokenizer of a run, if any, into `directory` (beside a model's save_pretrained files), with the chat
    template a chat run trained with (chat_template.jinja, which transformers loads with the tokenizer)."""
    if is_stored(pre):
        TextTokenizer.from_preprocess(pre).save(directory)
        template = pre.get("chat_template")
        if isinstance(template, str) and template:
            (directory / "chat_template.jinja").write_text(template, encoding="utf-8")


def tokenizer_note(tok: TextTokenizer, extra: dict[str, Any]) -> dict[str, Any]:
    """The data report's `tokenizer` section: which tokenizer, and `extra` facts of what it tokenized."""
    return {"kind": tok.kind, "origin": tok.origin, "vocab_size": tok.vocab_size, "pad_id": tok.pad_id, **extra}


def is_stored(pre: Optional[dict[str, Any]]) -> bool:
    return bool(pre) and isinstance(pre.get("tokenizer_files"), dict) and TOKENIZER_FILE in pre["tokenizer_files"]


def train_bpe(texts: Iterable[str], *, vocab_size: int, min_frequency: int) -> TextTokenizer:
    """A byte-level BPE (GPT-2's scheme: every byte is a token, so no text is unknown) trained on `texts`.
    Deterministic: the same texts give the same merges."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=list(BPE_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer=trainer)
    pad, eos = BPE_SPECIAL_TOKENS
    hf_config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": pad, "eos_token": eos}  # AutoTokenizer's
    files = {TOKENIZER_FILE: backend.to_str(), "tokenizer_config.json": json.dumps(hf_config, indent=1)}
    return TextTokenizer("bpe", files, pad_id=0, eos_id=1,
                         origin="byte-level BPE trained on the training split")


def pretrained_tokenizer(source: str, field_name: str, trust_remote_code: bool = False) -> TextTokenizer:
    """The tokenizer of a transformers model (hub id or directory; offline-first like the model itself); its own code
    runs only with `trust_remote_code` (trainforge keeps its fast tokenizer's files either way)."""
    # heavy (transformers, ~3 s) and only for data.tokenizer: model
    from transformers import AutoTokenizer

    from trainforge.errors import UserError
    from trainforge.hub import from_hub

    tok = from_hub(AutoTokenizer.from_pretrained, source, "tokenizer", field=field_name,
                   trust_remote_code=trust_remote_code)
    if not getattr(tok, "is_fast", False):
        raise UserError(f"{field_name}: {source!r} has only a slow (Python) tokenizer; trainforge needs its fast "
                        "tokenizer (tokenizer.json): convert it with transformers, or use data.tokenizer: bpe")
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token  # causal LMs ship without padding: pad with end-of-text, as usual
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        files = {p.name: p.read_text(encoding="utf-8") for p in sorted(Path(tmp).iterdir())
                 if p.is_file() and p.suffix in (".json", ".jinja") and p.name not in SLOW_TOKENIZER_FILES}
    files[TOKENIZER_FILE] = tok.backend_tokenizer.to_str()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    return TextTokenizer("model", files, pad_id=int(pad), eos_id=tok.eos_token_id, origin=source)


def transformers_tokenizer(tok: TextTokenizer) -> Any:
    """The transformers tokenizer of `tok`'s files (the model's, or the stored ones), for apply_chat_template."""
    from transformers import AutoTokenizer  # heavy: only for chat data

    with tempfile.TemporaryDirectory() as tmp:
        tok.save(Path(tmp))
        try:  # the stored files: a tokenizer whose class is its own code is not rebuilt from them
            return AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)
        except ValueError as e:
            if "trust_remote_code" not in str(e):
                raise
            raise UserError(f"data.tokenizer: {tok.origin}'s tokenizer is a class of its own code; chat data needs a "
                            "tokenizer transformers ships (use data.tokenizer: bpe, or another model's)",
                            public=True) from None
