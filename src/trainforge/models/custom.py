"""`custom`: the user's own model, named by `model.target`. Two forms, both imported only when a config
names them:

    model: {name: custom, target: "my_models:build", args: {width: 64}}

    # my_models.py (importable from the current directory or PYTHONPATH)
    def build(info, width=32):            # a factory: info is trainforge.data.base.DataInfo
        return MyNet(info.input_shape, info.num_classes, width)   # or (module, InputSpec)

    class MyCNN(nn.Module):               # or the nn.Module class itself: parameters named like the
        def __init__(self, in_channels, num_classes, width=32): ...   # data's facts are filled from it

The facts a parameter can be named after (`DATA_FACTS`): every `DataInfo` field — task, modality,
input_shape, input_dtype, num_classes, class_names, vocab_size, seq_len — and in_channels (images: C),
in_features (float inputs: the product of input_shape), image_size (images: H when H == W, else (H, W)), and
`info` itself. Everything else comes from `model.args`; a value in `model.args` wins over the data's.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.imports import call_user, load_target
from trainforge.models.base import InputSpec, NamedInputs
from trainforge.models.zoo import ANY_DATA, input_spec, register_model


def data_facts(info: DataInfo) -> dict[str, Any]:
    """Constructor parameters the data fills, by name; None where this data has no such fact."""
    shape = tuple(info.input_shape)
    image = len(shape) == 3 and info.input_dtype == "float32" and not info.inputs  # one (C, H, W) picture
    return {
        "info": info,
        **{f.name: getattr(info, f.name) for f in dataclasses.fields(info)},
        "in_channels": shape[0] if image else None,
        "in_features": math.prod(shape) if info.input_dtype == "float32" else None,
        "image_size": (shape[1] if shape[1] == shape[2] else shape[1:]) if image else None,
    }


DATA_FACTS = ("info", *(f.name for f in dataclasses.fields(DataInfo)), "in_channels", "in_features", "image_size")


@register_model("custom", fits=ANY_DATA)
def build_custom(info: DataInfo, target: Optional[str] = None, **args: Any) -> tuple[nn.Module, InputSpec]:
    """Call the user's factory(info, **args) or Module class(<data facts by name>, **args); a bare module gets
    the data's default InputSpec."""
    factory = load_target(target, "model.target")
    result = call_user(factory, target=target, key="model.target", args_key="model.args", args=args, filled=data_facts(info),
                       first=info)
    module, spec = result if isinstance(result, tuple) and len(result) == 2 else (result, input_spec(info))
    if not isinstance(module, nn.Module) or not isinstance(spec, (InputSpec, NamedInputs)):
        raise UserError(
            f"model.target: {target} returned {type(result).__name__}; a model factory must return "
            "an nn.Module or (nn.Module, InputSpec)"
        )
    return module, spec
