"""The data pipeline behind one entry point.

    from trainforge.data import build_data
    bundle = build_data(cfg.data, seed=cfg.seed)     # DataBundle: info, train, val, test, preprocess, report
    summary = summarize(bundle.report)                # console line, warnings, --json counts

Sources are looked up in `SOURCES` by `data.source`; loaders live in `trainforge.data.stages.loader`.
The names below load on first use, so the torch-free subpackages (`text`, `image`) serve `trainforge predict`
without importing torch.

    sources/   the data sources (registry SOURCES), each a Pool of raw samples
    stages/    what the pipeline does to a pool: clean, split, normalize, augment; the split datasets and loaders
    text/      text into token ids: byte and subword tokenizers, chat templates
    image/     images as the models take them: reading, a pretrained model's preprocessing
    formats/   what is kept on disk: an image folder's manifest, token shards, WebDataset tar shards
"""
from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A package's module `__getattr__` (PEP 562): `name` imported from the module `exports[name]` on first use, then
    kept in the package (data/text uses it too)."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(exports[name]), name)
        namespace[name] = value
        return value

    return __getattr__


_LAZY = {
    "DataBundle": "trainforge.data.base",
    "DataInfo": "trainforge.data.base",
    "build_data": "trainforge.data.pipeline",
    "SOURCES": "trainforge.data.sources",
    "DataSummary": "trainforge.data.summary",
    "summarize": "trainforge.data.summary",
}
__all__ = sorted(_LAZY)
__getattr__ = lazy_exports(__name__, _LAZY)
