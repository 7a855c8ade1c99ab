"""`mlp`: a multilayer perceptron over any float input, flattened (tabular rows or small images).

    model: {name: mlp, args: {hidden: [256, 256], dropout: 0.1, activation: gelu}}
"""
from __future__ import annotations

import math
from typing import Sequence

from torch import nn

from trainforge.data.base import DataInfo
from trainforge.models import args as check
from trainforge.models.base import InputSpec
from trainforge.models.zoo import FLOAT_CLASSIFICATION, input_spec, register_model

ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


def mlp_layers(
    num_inputs: int, hidden: Sequence[int], num_outputs: int, dropout: float, activation: str
) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Flatten()]
    width = num_inputs
    for h in hidden:
        layers += [nn.Linear(width, h), ACTIVATIONS[activation](), nn.Dropout(dropout)]
        width = h
    layers.append(nn.Linear(width, num_outputs))
    return nn.Sequential(*layers)


@register_model("mlp", fits=FLOAT_CLASSIFICATION)
def build_mlp(
    info: DataInfo, hidden: Sequence[int] = (256, 256), dropout: float = 0.0, activation: str = "gelu"
) -> tuple[nn.Module, InputSpec]:
    hidden = check.int_list("hidden", hidden, allow_empty=True)  # [] is logistic regression
    dropout = check.probability("dropout", dropout)
    activation = check.choice("activation", activation, list(ACTIVATIONS))
    model = mlp_layers(math.prod(info.input_shape), hidden, info.num_classes, dropout, activation)
    return model, input_spec(info)
