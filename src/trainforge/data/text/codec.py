"""A tokenizer as the code that encodes and decodes with it needs it: a run's stored one, or the raw byte rules.

    codec = codec_for(trained.preprocess)         # generate: RawBytes (raw_bytes runs) or StoredTokenizer (model, bpe)
    ids = codec.encode("Once upon a time"); text = codec.decode(ids)
    ids, stop_ids, stop_text = codec.chat("What is LoRA?")    # the prompt as a user turn of the run's chat template
    index = prepare_shards(corpus, RawBytes())    # token shards: `identity()` keys them, `encoder()` runs in the pool
    index = prepare_shards(corpus, Subword.of(tok))

`RawBytes` is the one raw-bytes codec (id = byte value, vocab 256, no special tokens): the token shards of a
`raw_bytes` corpus and `trainforge generate` of a `raw_bytes` run both use it. `Subword` is a `TextTokenizer` as a
shard worker needs it (its tokenizer.json as text: light to send to a process). Torch-free; `StoredTokenizer` imports
transformers when it is built.
"""
from __future__ import annotations

import codecs
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

import numpy as np
from tokenizers import Tokenizer

from trainforge.data.text.byte_level import RAW_BYTES_VOCAB_SIZE, decode_raw, encode_raw
from trainforge.data.text.tokenizer import TOKENIZER_FILE, TextTokenizer, is_stored
from trainforge.errors import UserError


class Codec:
    """What generate needs of a tokenizer."""

    eos_ids: tuple[int, ...] = ()
    pad_id: Optional[int] = None
    vocab_size: Optional[int] = None

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def shown(self, ids: Sequence[int]) -> str:
        """The ids as text the way the model saw them (a chat template's markers included)."""
        return self.decode(ids)

    def start_ids(self) -> list[int]:
        raise UserError("prompt: empty, and this run's tokenizer has no start or end-of-text token to begin from; "
                        "give some text to continue")

    def chat(self, prompt: str) -> tuple[list[int], tuple[int, ...], Optional[str]]:
        """The prompt as one user message of the chat template, with the generation prompt; and what ends the
        assistant's turn: token ids, or a text."""
        raise NotImplementedError

    def end_of_turn(self) -> tuple[tuple[int, ...], Optional[str]]:
        """What ends an assistant's turn besides the end-of-text ids: token ids, or a text (none by default)."""
        return (), None


class Encoder(Protocol):
    """A shard worker's tokenizer: bytes of a document in order, `doc_end` with its last ones."""

    def __call__(self, data: bytes, doc_end: bool, separator: bytes) -> np.ndarray: ...


@dataclass(frozen=True)
class RawBytes(Codec):
    """`raw_bytes` (textfile with the byte tokenizer): token id = byte value (vocab 256, no end-of-document token;
    in token shards, `separator` bytes end a document that is a row of a table, so rows do not run into each other)."""

    kind: str = "raw_bytes"
    vocab_size: int = RAW_BYTES_VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return encode_raw(text)

    def decode(self, ids: Sequence[int]) -> str:
        return decode_raw(ids)

    def chat(self, prompt: str) -> tuple[list[int], tuple[int, ...], Optional[str]]:
        raise UserError("--chat: this run uses the raw byte tokenizer, which has no chat template; drop --chat "
                        "(the prompt is then continued as plain text)")

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def encoder(self, own_threads: bool) -> Encoder:
        def encode(data: bytes, doc_end: bool, separator: bytes) -> np.ndarray:
            return np.frombuffer(data + separator if doc_end else data, dtype=np.uint8)

        return encode


@dataclass(frozen=True)
class Subword:
    """A subword tokenizer (data.tokenizer: model | bpe) in token shards: without special tokens, eos_id after each
    document."""

    kind: str
    tokenizer_json: str
    eos_id: Optional[int]
    vocab_size: int

    @classmethod
    def of(cls, tok: TextTokenizer) -> "Subword":
        return cls(tok.kind, tok.files[TOKENIZER_FILE], tok.eos_id, tok.vocab_size)

    def identity(self) -> dict[str, Any]:
        digest = hashlib.sha256(self.tokenizer_json.encode("utf-8")).hexdigest()
        return {"kind": self.kind, "tokenizer_json_sha256": digest, "eos_id": self.eos_id}

    def encoder(self, own_threads: bool) -> Encoder:
        if not own_threads:  # one of several pool workers: the pool is the parallelism, not `tokenizers`' threads
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
        backend = Tokenizer.from_str(self.tokenizer_json)
        backend.no_padding()
        backend.no_truncation()
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        eos = [] if self.eos_id is None else [self.eos_id]

        def encode(data: bytes, doc_end: bool, separator: bytes) -> np.ndarray:
            text = decoder.decode(data, final=doc_end)
            ids = backend.encode(text, add_special_tokens=False).ids if text else []
            if doc_end:
                decoder.reset()
                ids = ids + eos
            return np.asarray(ids, dtype=np.int64)

        return encode


ShardTokenizer = RawBytes | Subword


class StoredTokenizer(Codec):
    """The run's stored subword tokenizer as a transformers fast tokenizer (for its chat template)."""

    def __init__(self, pre: dict[str, Any]) -> None:
        # heavy (transformers, ~3 s): loaded already when the run's model is an hf one
        from transformers import PreTrainedTokenizerFast

        with tempfile.TemporaryDirectory() as tmp:
            for name, content in pre["tokenizer_files"].items():
                (Path(tmp) / Path(name).name).write_text(content, encoding="utf-8")
            self.tok = PreTrainedTokenizerFast.from_pretrained(tmp, trust_remote_code=False)  # the class is fixed
        eos = pre.get("eos_id", self.tok.eos_token_id)
        self.eos_ids = () if eos is None else (int(eos),)
        pad = pre.get("pad_id", self.tok.pad_token_id)
        self.pad_id = eos if pad is None else int(pad)
        self.vocab_size = len(self.tok)
        stored = pre.get("chat_template")  # a chat run's: the template it trained with, its own or a built-in one
        self.template = stored if isinstance(stored, str) else self.tok.chat_template

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))  # as the training text was (encode_stream)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def shown(self, ids: Sequence[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def start_ids(self) -> list[int]:
        first = self.tok.bos_token_id if self.tok.bos_token_id is not None else (self.eos_ids or (None,))[0]
        return super().start_ids() if first is None else [int(first)]

    def chat(self, prompt: str) -> tuple[list[int], tuple[int, ...], Optional[str]]:
        if not self.template:
            raise UserError("--chat: the run's tokenizer has no chat template; train with one (data.source: chat "
                            "with data.args.template, or a model whose tokenizer ships one), or drop --chat to "
                            "continue the prompt as plain text")
        try:
            rendered = self.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
        except Exception as e:  # the template is the model's own Jinja code: any error it raises is its message
            raise UserError(f"--chat: the tokenizer's chat template failed on the prompt ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from None
        # the template writes its special tokens (a start token, turn markers) as text: encode them, add no more
        return (self.encode(rendered), *self.end_of_turn())

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return str(self.tok.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                add_generation_prompt=add_generation_prompt))

    def end_of_turn(self) -> tuple[tuple[int, ...], Optional[str]]:
        """What the template closes an assistant turn with, found by rendering a finished exchange and reading
        what follows the answer: a special token (<|im_end|>, <|eot_id|>, </s>, ...), else that text."""
        marker = "\x00answer\x00"
        try:
            rendered = self.render([{"role": "user", "content": "question"}, {"role": "assistant", "content": marker}])
        except Exception:  # a template that takes no assistant turn: stop at eos only
            return (), None
        _, found, after = rendered.partition(marker)
        after = after.strip() if found else ""
        ids = self.encode(after) if after else []
        special = set(self.tok.all_special_ids) | {int(i) for i in self.tok.added_tokens_decoder}
        if ids and ids[0] in special:
            return (ids[0],), None
        return (), after or None


def codec_for(pre: dict[str, Any]) -> Codec:
    """The codec of a run's preprocessing record: its stored subword tokenizer, or the raw byte rules."""
    if is_stored(pre):
        return StoredTokenizer(pre)
    if pre.get("tokenizer") == "raw_bytes":
        return RawBytes()
    raise UserError(f"the run's preprocessing record has no usable tokenizer ({pre.get('tokenizer')!r}); generate "
                    "needs data.tokenizer model, bpe or raw_bytes")
