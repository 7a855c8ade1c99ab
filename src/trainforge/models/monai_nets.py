"""`model.name: monai`: a MONAI network for volumes (CT, MRI), built for the data's channels and classes.

    model:
      name: monai
      args:
        arch: DenseNet121          # DenseNet121/169/201, DenseNet (its sizes in args), resnet10/18/34/50
        # any argument of that network: init_features: 32, block_config: [4, 8, 12], dropout_prob: 0.2 ...

`spatial_dims`, the input channels and the classes come from the data; every other argument is the network's own
(MONAI's names; an unknown one is one line listing what the network takes). Random weights: MONAI publishes no 3D
classification weights that load offline.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models.base import InputSpec
from trainforge.models.zoo import DataFit, input_spec, register_model

VOLUME_CLASSIFICATION = DataFit(
    "classification of volumes (float C,D,H,W inputs: data.source volumes)",
    lambda info: info.input_dtype == "float32" and len(info.input_shape) == 4, ("classification",),
)

# arch -> (the data's arguments by MONAI's names: spatial dims, input channels, classes)
CLASSIFIERS: dict[str, tuple[str, str, str]] = {
    **{name: ("spatial_dims", "in_channels", "out_channels")
       for name in ("DenseNet121", "DenseNet169", "DenseNet201", "DenseNet")},
    **{name: ("spatial_dims", "n_input_channels", "num_classes")
       for name in ("resnet10", "resnet18", "resnet34", "resnet50")},
}


def network_parameters(net: Callable[..., Any]) -> list[str]:
    """The keyword arguments a MONAI network takes (DenseNet121's kwargs go on to DenseNet, a resnet* builder's to
    ResNet)."""
    import monai.networks.nets as nets

    params = inspect.signature(net).parameters
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        forwards_to = nets.ResNet if getattr(net, "__name__", "").startswith("resnet") else nets.DenseNet
        if forwards_to is not net:
            names += network_parameters(forwards_to)
    return [n for n in names if n not in ("self", "pretrained", "progress", "block", "layers", "block_inplanes")]


@register_model("monai", fits=VOLUME_CLASSIFICATION)
def monai_network(info: DataInfo, arch: str = "DenseNet121", **net_args: Any) -> tuple[nn.Module, InputSpec]:
    """arch: a MONAI classification network; net_args: its own arguments."""
    import monai.networks.nets as nets

    if arch not in CLASSIFIERS:
        raise UserError(f"model.args.arch: {arch!r} is not a MONAI volume classifier trainforge builds; choose one of "
                        f"{', '.join(CLASSIFIERS)}")
    net = getattr(nets, arch)
    dims, channels, classes = CLASSIFIERS[arch]
    accepted = network_parameters(net)
    for key in net_args:
        if key in (dims, channels, classes):
            raise UserError(f"model.args.{key}: set from the data ({len(info.input_shape) - 1} spatial dims, "
                            f"{info.input_shape[0]} channels, {info.num_classes} classes); remove it")
        if key not in accepted:
            listed = ", ".join(sorted(set(accepted) - {dims, channels, classes}))
            raise UserError(f"model.args.{key}: unknown argument for MONAI's {arch}; it takes arch and {listed}")
    kwargs = {dims: len(info.input_shape) - 1, channels: info.input_shape[0], classes: info.num_classes, **net_args}
    try:
        model = net(**kwargs)
    except (TypeError, ValueError, AssertionError) as e:
        raise UserError(f"model.args: MONAI's {arch} refused {net_args}: {e}") from None
    return model, input_spec(info)
