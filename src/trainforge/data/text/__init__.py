"""Text into token ids, in one place: what every other part of trainforge imports to tokenize.

    from trainforge.data.text import encode, TextTokenizer, codec_for
    ids = encode("great fun", seq_len=128)            # data.tokenizer: bytes (text classification, jsonl)
    tok = TextTokenizer.from_preprocess(pre)          # a run's stored subword tokenizer (model | bpe)
    codec = codec_for(pre)                            # generate: encode, decode, chat (raw_bytes or stored)

The modules, each for one kind of tokenizer or one use of them:
- `byte_level`: the byte rules (`bytes`: id = byte + 1, padded; `raw_bytes`: id = byte value);
- `tokenizer`: subword tokenizers (`TextTokenizer`: a pretrained model's, or a BPE trained on the data), stored with
  the run as the text of their files;
- `codec`: a tokenizer as encoding code needs it: `RawBytes` (the one raw-bytes codec: token shards and generate),
  `Subword` (a shard worker's), `StoredTokenizer` and `codec_for` (generate's);
- `chat_templates`: the built-in chat templates.

How the pipeline makes samples of texts (tokenizing a source's texts, conversations) is `data/corpus/`, above this
folder, the token shards and the pool. The names below load on first use: `trainforge predict` (bytes and subword
tokenizers) and the token shards' pool workers import no torch.
"""
from __future__ import annotations

from trainforge.data import lazy_exports

_MODULES = {
    "byte_level": ("encode", "decode", "encode_raw", "decode_raw", "PAD_ID", "BYTES_VOCAB_SIZE",
                   "RAW_BYTES_VOCAB_SIZE"),
    "tokenizer": ("TextTokenizer", "train_bpe", "pretrained_tokenizer", "save_tokenizer", "is_stored",
                  "tokenizer_note"),
    "codec": ("Codec", "RawBytes", "Subword", "StoredTokenizer", "codec_for"),
    "chat_templates": ("TEMPLATES", "DEFAULT_TEMPLATE", "CHATML", "LLAMA3", "ALPACA"),
}
_LAZY = {name: f"trainforge.data.text.{module}" for module, names in _MODULES.items() for name in names}
__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
