"""`custom`: the user's own model, from the factory that `model.target` names.

    model: {name: custom, target: "my_models:build", args: {width: 64}}

    # my_models.py (importable from sys.path or the current directory)
    def build(info, width=32):          # info: trainforge.data.base.DataInfo
        return MyNet(info.input_shape, info.num_classes, width)   # or (module, InputSpec)

The module is imported only when a config names it. The factory's own signature decides which
`model.args` it accepts.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Optional

from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models.base import InputSpec
from trainforge.models.zoo import ANY_DATA, check_args, input_spec, register_model

FORM = "'pkg.module:factory', e.g. 'my_models:build'"


def load_target(target: Optional[str], key: str = "model.target") -> Callable[..., Any]:
    """Import `pkg.module:attr` and return the callable; every failure is a UserError naming `key`."""
    if target is None:
        raise UserError(f"{key}: required when model.name is custom; set it to {FORM}")
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise UserError(f"{key}: expected {FORM}, got {target!r}")
    module_name, attr = target.split(":")
    # console scripts do not put the working directory on sys.path; `python -m` does. Users expect
    # a my_models.py next to their recipe to import either way.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not module_name.startswith(e.name):
            raise  # the user's module itself failed to import something: their traceback helps most
        raise UserError(
            f"{key}: cannot import module {module_name!r} ({e}); "
            f"expected {FORM} importable from the current directory or PYTHONPATH"
        ) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{key}: module {module_name!r} has no attribute {attr!r}; expected {FORM}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{key}: {target} is not callable; expected {FORM}")
    return obj


@register_model("custom", fits=ANY_DATA)
def build_custom(info: DataInfo, target: Optional[str] = None, **args: Any) -> tuple[nn.Module, InputSpec]:
    """Call the user's factory(info, **args); a bare module gets the data's default InputSpec."""
    factory = load_target(target)
    check_args(f"custom model {target}", factory, args)
    result = factory(info, **args)
    module, spec = result if isinstance(result, tuple) and len(result) == 2 else (result, input_spec(info))
    if not isinstance(module, nn.Module) or not isinstance(spec, InputSpec):
        raise UserError(
            f"model.target: {target} returned {type(result).__name__}; a model factory must return "
            "an nn.Module or (nn.Module, InputSpec)"
        )
    return module, spec
