"""Byte-level tokenizers as pure functions; the exporter and `predict` reuse them.

Two schemes, named in `preprocess["tokenizer"]`:
- ``"bytes"`` (classification, jsonl): id = byte + 1, 0 = padding, vocab 257, fixed `seq_len`.
- ``"raw_bytes"`` (language modelling, textfile): id = byte value, vocab 256, no padding.
"""
from __future__ import annotations

from typing import Iterable

PAD_ID = 0
BYTES_VOCAB_SIZE = 257
RAW_BYTES_VOCAB_SIZE = 256


def encode(text: str, seq_len: int) -> list[int]:
    """UTF-8 bytes shifted by one, truncated or right-padded with PAD_ID to exactly `seq_len` ids."""
    ids = [b + 1 for b in text.encode("utf-8")[:seq_len]]
    return ids + [PAD_ID] * (seq_len - len(ids))


def decode(ids: Iterable[int]) -> str:
    """Inverse of `encode`: padding is dropped; a multi-byte character cut by truncation becomes U+FFFD."""
    return bytes(int(i) - 1 for i in ids if int(i) != PAD_ID).decode("utf-8", errors="replace")


def encode_raw(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode_raw(ids: Iterable[int]) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
