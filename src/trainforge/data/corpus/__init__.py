"""Texts made samples: a source's texts tokenized into a pool (`tokenize`: `choose_tokenizer`, `TextSamples`,
`TextCorpus`, `TokenWindows`) and conversations rendered, tokenized, loss-marked and packed (`chat`).

Above `text/` (the tokenizers and codecs), `formats/` (token shards), `stages/` and `pool`, which they use; the
sources import them. The names load on first use (torch).
"""
from __future__ import annotations

from trainforge.data import lazy_exports

_MODULES = {
    "chat": ("ChatTokens", "ChatWindows", "tokenize_chat", "pack_chat"),
    "tokenize": ("TextSamples", "TextCorpus", "TokenWindows", "choose_tokenizer", "corpus_tokenizer"),
}
_LAZY = {name: f"trainforge.data.corpus.{module}" for module, names in _MODULES.items() for name in names}
__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
