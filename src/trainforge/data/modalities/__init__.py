"""The modalities a sample's input may be, each a plug-in (`MODALITIES`; torch-free, so predict can ask them).

    from trainforge.data.modalities import MODALITIES
    MODALITIES.get("image").channel_view          # (-1, 1, 1)

Importing this package registers the shipped ones: image, text, tabular, volume, multimodal, pointcloud. A plug-in module
registers its own with `register_modality` (docs/architecture.md "Adding a modality").
"""
from __future__ import annotations

from trainforge.data.modalities import image, multimodal, pointcloud, tabular, text, volume  # noqa: F401  (they register)
from trainforge.data.modalities.base import MODALITIES, Modality, Reader, Sample, register_modality

__all__ = ["MODALITIES", "Modality", "Reader", "Sample", "register_modality"]
