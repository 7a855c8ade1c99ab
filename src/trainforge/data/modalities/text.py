"""Text: (T,) int64 token ids of a fixed length, from the run's tokenizer (data/text)."""
from __future__ import annotations

from typing import Any, BinaryIO, Callable, Iterator, Optional, Sequence

import numpy as np

from trainforge.data.modalities.base import Modality, Reader, Sample, register_modality
from trainforge.data.modalities.inputs import display_name, input_shape, read_bytes, require_files, text_lines
from trainforge.errors import UserError
from trainforge.registry import Registry

# preprocess.tokenizer -> (the preprocessing record, seq_len) -> a line's token ids
TOKENIZERS: Registry[Callable[[dict[str, Any], int], Callable[[str], list[int]]]] = Registry(
    "tokenizer", "preprocess.tokenizer")


@register_modality
class Text(Modality):
    name = "text"
    description = "token ids (T,): not normalized; text classification augments by window crops, dropout, masking"
    takes_tokenizer = True
    served = "text files (one input per line) or - for standard input"

    def augmenter(self, cfg: Any, info: Any, value_range: tuple[float, float], task: Any) -> tuple[Any, tuple[str, ...], str]:
        if not task.token_augmentation:
            return super().augmenter(cfg, info, value_range, task)
        from trainforge.data.stages.augment import TEXT_OPS, build_text_augment

        return build_text_augment(cfg, info.pad_id), TEXT_OPS, "image augmentation does not apply to text; use data.augment.token_*"

    def reader(self, meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
        """Text files or '-' -> int64 (T,) per non-empty line, tokenized as in training."""
        pre = meta.get("preprocess", {})
        (seq_len,) = input_shape(meta, 1, artifact)
        name = pre.get("tokenizer")
        if name not in TOKENIZERS:
            raise UserError(
                f"{artifact}: tokenizer {name!r} in its metadata cannot serve classification; "
                f"predict knows: {', '.join(TOKENIZERS.names())}"
            )
        try:
            tokenize = TOKENIZERS.get(name)(pre, seq_len)
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(f"{artifact}: its {name} tokenizer cannot be read ({e}); re-export it") from None
        vocab_size = int(pre.get("vocab_size") or 0)

        def read(inputs: Sequence[str]) -> Iterator[Sample]:
            require_files(inputs, "text files (one input per line) or - for standard input", allow_stdin=True)
            for source in inputs:
                for line_no, line in text_lines(read_bytes(source, stdin)):
                    where = f"INPUT: {display_name(source)} line {line_no}"
                    try:
                        ids = np.asarray(tokenize(line), dtype=np.int64)
                    except ValueError as e:
                        raise UserError(f"{where}: {e}; fix or remove that line") from None
                    if vocab_size and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                        raise UserError(f"{where}: token ids must be in 0..{vocab_size - 1} (the model's vocabulary); fix that line")
                    yield line, ids

        return read


@TOKENIZERS.register("bytes")
def bytes_tokens(pre: dict[str, Any], seq_len: int) -> Callable[[str], list[int]]:
    from trainforge.data.text.byte_level import encode  # torch-free; the jsonl source's tokenizer

    return lambda line: encode(line, seq_len)


@TOKENIZERS.register("none")
def integer_tokens(pre: dict[str, Any], seq_len: int) -> Callable[[str], list[int]]:
    """The line is the token ids themselves, space separated (synthetic_text); there is no padding id."""

    def tokenize(line: str) -> list[int]:
        try:
            ids = [int(tok) for tok in line.split()]
        except ValueError:
            raise ValueError("expected space-separated integer token ids") from None
        if len(ids) != seq_len:
            raise ValueError(f"{len(ids)} token ids; the model takes exactly {seq_len}")
        return ids

    return tokenize


@TOKENIZERS.register("model")
@TOKENIZERS.register("bpe")
def stored_tokens(pre: dict[str, Any], seq_len: int) -> Callable[[str], list[int]]:
    """The run's own subword tokenizer, from the files stored in its metadata (the `tokenizers` library only)."""
    from trainforge.data.text.tokenizer import TextTokenizer, is_stored  # tokenizers + numpy, no torch

    if not is_stored(pre):
        raise ValueError("its metadata lacks the tokenizer's files")
    tok = TextTokenizer.from_preprocess(pre)
    return lambda line: tok.encode_fixed([line], seq_len)[0].tolist()
