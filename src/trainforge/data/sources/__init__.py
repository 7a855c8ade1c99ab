"""The data sources, one registered function each; importing this package registers them all."""
from __future__ import annotations

from trainforge.data.sources import (  # noqa: F401  (imported to register)
    chat,
    coco,
    custom,
    digits,
    hf_datasets,
    imagefolder,
    jsonl,
    masks,
    multimodal,
    pointclouds,
    synthetic,
    tabular,
    textfile,
    torchvision_datasets,
    voc,
    volumes,
    webdataset,
    yolo,
)
from trainforge.data.sources.common import SOURCES

__all__ = ["SOURCES"]
