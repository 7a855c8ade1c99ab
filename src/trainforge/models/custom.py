"""`custom`: the user's own model, from the factory that `model.target` names.

    model: {name: custom, target: "my_models:build", args: {width: 64}}

    # my_models.py (importable from sys.path or the current directory)
    def build(info, width=32):          # info: trainforge.data.base.DataInfo
        return MyNet(info.input_shape, info.num_classes, width)   # or (module, InputSpec)

The module is imported only when a config names it. The factory's own signature decides which
`model.args` it accepts.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.imports import load_target
from trainforge.models.base import InputSpec
from trainforge.models.zoo import ANY_DATA, check_args, input_spec, register_model

@register_model("custom", fits=ANY_DATA)
def build_custom(info: DataInfo, target: Optional[str] = None, **args: Any) -> tuple[nn.Module, InputSpec]:
    """Call the user's factory(info, **args); a bare module gets the data's default InputSpec."""
    factory = load_target(target, "model.target")
    check_args(f"custom model {target}", factory, args)
    result = factory(info, **args)
    module, spec = result if isinstance(result, tuple) and len(result) == 2 else (result, input_spec(info))
    if not isinstance(module, nn.Module) or not isinstance(spec, InputSpec):
        raise UserError(
            f"model.target: {target} returned {type(result).__name__}; a model factory must return "
            "an nn.Module or (nn.Module, InputSpec)"
        )
    return module, spec
