"""The data pipeline behind one entry point.

    from trainforge.data import build_data
    bundle = build_data(cfg.data, seed=cfg.seed)     # DataBundle: info, train, val, test, preprocess, report

Sources are looked up in `SOURCES` by `data.source`; loaders live in `trainforge.data.loader`.
"""
from __future__ import annotations

from trainforge.data.base import DataBundle, DataInfo
from trainforge.data.pipeline import build_data
from trainforge.data.sources import SOURCES

__all__ = ["SOURCES", "DataBundle", "DataInfo", "build_data"]
