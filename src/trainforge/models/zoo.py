"""The model registry and `build_model`, the one way the rest of trainforge gets a model.

    model, spec = build_model(cfg.model, bundle.info)
    logits = model(spec.example(batch_size=8))

A family registers its factory with `@register_model(name, fits=...)`; `fits` says which data the
model suits so a mismatch is caught before building, with the names of the models that do fit.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models.lora import apply_lora
from trainforge.models.base import InputSpec
from trainforge.registry import Registry

Factory = Callable[..., "tuple[nn.Module, InputSpec]"]

MODELS: Registry[Factory] = Registry("model", "model.name")


@dataclass(frozen=True)
class DataFit:
    """Which data a model suits: `needs` is said in error messages; `tasks` are the tasks (trainforge.tasks) the
    family serves, None for any; `accepts` decides on the inputs."""

    needs: str
    accepts: Callable[[DataInfo], bool]
    tasks: Optional[tuple[str, ...]] = None

    def fits(self, info: DataInfo) -> bool:
        return (self.tasks is None or info.task in self.tasks) and self.accepts(info)


CLASSIFICATION = ("classification",)
ANY_DATA = DataFit("any data", lambda info: True)
FLOAT_CLASSIFICATION = DataFit(
    "classification of float inputs (images or tabular)",
    lambda info: info.input_dtype == "float32", CLASSIFICATION,
)
IMAGE_CLASSIFICATION = DataFit(
    "image classification (float C,H,W inputs)",
    lambda info: info.input_dtype == "float32" and len(info.input_shape) == 3, CLASSIFICATION,
)
TOKEN_CLASSIFICATION = DataFit(
    "text classification (int64 token inputs)",
    lambda info: info.input_dtype == "int64" and len(info.input_shape) == 1, CLASSIFICATION,
)
LANGUAGE_MODELLING = DataFit(
    "language modelling (task lm, int64 token inputs)",
    lambda info: info.input_dtype == "int64" and len(info.input_shape) == 1, ("lm",),
)

_FITS: dict[str, DataFit] = {}


def register_model(name: str, fits: DataFit) -> Callable[[Factory], Factory]:
    def decorator(factory: Factory) -> Factory:
        MODELS.register(name)(factory)
        _FITS[name] = fits
        return factory

    return decorator


def models_that_fit(info: DataInfo) -> list[str]:
    return [name for name in MODELS.names() if _FITS[name].fits(info)]


def input_spec(info: DataInfo) -> InputSpec:
    """The example input a model built for `info` takes (token ids are bounded by the vocabulary)."""
    if info.input_dtype == "int64":
        return InputSpec(tuple(info.input_shape), torch.int64, high=info.vocab_size or info.num_classes)
    return InputSpec(tuple(info.input_shape), torch.float32)


def check_args(what: str, factory: Callable[..., Any], args: dict[str, Any]) -> None:
    """Unknown or missing `model.args` keys, named against the factory's own signature."""
    params = list(inspect.signature(factory).parameters.values())[1:]  # the first one is info
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    listed = ", ".join(accepted) or "none"
    for key in args:
        if key not in accepted:
            raise UserError(f"model.args.{key}: unknown argument for {what}; accepted: {listed}")
    for p in params:
        if p.name in accepted and p.default is p.empty and p.name not in args:
            raise UserError(f"model.args.{p.name}: required by {what}; accepted: {listed}")


def build_model(cfg: ModelConfig, info: DataInfo) -> tuple[nn.Module, InputSpec]:
    """Build the model `cfg` names for data described by `info`: (module, example-input spec).

    Works under `torch.device("meta")` and `FakeTensorMode` (factories never move tensors), so the
    planner can build models of any size for free.
    """
    factory = MODELS.get(cfg.name)
    if cfg.target is not None and cfg.name != "custom":
        raise UserError(
            f"model.target: only used with model.name: custom (model.name is {cfg.name!r}); "
            "set model.name: custom or remove model.target"
        )
    fit = _FITS[cfg.name]
    if not fit.fits(info):
        shape = "x".join(map(str, info.input_shape))
        raise UserError(
            f"model.name: {cfg.name} needs {fit.needs}, but the data is {info.modality} {info.task} "
            f"with {info.input_dtype} inputs of shape {shape}; models that fit: {', '.join(models_that_fit(info))}"
        )
    args = dict(cfg.args)
    if cfg.name == "custom":
        args["target"] = cfg.target  # the one model whose code the config names
    check_args(f"model {cfg.name!r}", factory, args)
    model, spec = factory(info, **args)
    if cfg.lora is not None:
        pretrained = cfg.args.get("pretrained")
        model = apply_lora(model, cfg.lora, source=str(pretrained) if pretrained else None, quantize=cfg.quantize_base)
    return model, spec


def is_convolutional(model: nn.Module) -> bool:
    """Has Conv2d layers: such models run faster in channels_last memory format on CUDA."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())
