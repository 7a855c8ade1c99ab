"""The model zoo: every model is built by name from `cfg.model` for the data's `DataInfo`.

    from trainforge.models import build_model, MODELS
    model, spec = build_model(cfg.model, bundle.info)   # spec.example(8) is a valid input batch
    MODELS.names()  # cnn, custom, detector, gpt, hf, hybrid, mlp, resnet, segmenter, text_transformer, timm, vit

Add a model by writing a factory `f(info, **args) -> (nn.Module, InputSpec)` in its own module,
decorating it with `@register_model(name, fits=...)` and importing the module below.
"""
from __future__ import annotations

from trainforge.models.zoo import MODELS, build_model, input_spec, is_convolutional, models_that_fit, register_model

# importing a family registers it
from trainforge.models import cnn, custom, detectors, fusion, gpt, hf, hybrid, mlp, monai_nets, pointpillars, resnet, segmenters, text, timm_models, vit  # noqa: E402,F401  isort: skip

__all__ = ["MODELS", "build_model", "input_spec", "is_convolutional", "models_that_fit", "register_model"]
