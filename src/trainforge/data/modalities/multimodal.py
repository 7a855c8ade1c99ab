"""Several named inputs in one sample (data.source: multimodal): each input says its own modality
(`DataInfo.inputs`); the sample as a whole is normalized per input by its source and served from arrays."""
from __future__ import annotations

from trainforge.data.modalities.base import Modality, register_modality


@register_modality
class Multimodal(Modality):
    name = "multimodal"
    description = "named inputs of their own modalities (an image and a feature vector); predict reads .npz arrays"
