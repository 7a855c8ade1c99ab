"""`model.name: monai`: a MONAI network for volumes (CT, MRI), built for the data's channels and classes.

    model:
      name: monai
      args:
        arch: DenseNet121          # classification: DenseNet121/169/201, DenseNet (its sizes in args), resnet10/18/34/50
                                   # segmentation: UNet (default; channels 16-128, strides 2, 2 residual units),
                                   # SegResNet, BasicUNet: logits (N, classes, D, H, W)
        # any argument of that network: init_features: 32, block_config: [4, 8, 12], dropout_prob: 0.2 ...

`spatial_dims`, the input channels and the classes come from the data; every other argument is the network's own
(MONAI's names; an unknown one is one line listing what the network takes). Random weights: MONAI publishes no 3D
weights that load offline.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models.base import InputSpec
from trainforge.models.zoo import DataFit, input_spec, register_model

# arch -> (the data's arguments by MONAI's names: spatial dims, input channels, classes)
CLASSIFIERS: dict[str, tuple[str, str, str]] = {
    **{name: ("spatial_dims", "in_channels", "out_channels")
       for name in ("DenseNet121", "DenseNet169", "DenseNet201", "DenseNet")},
    **{name: ("spatial_dims", "n_input_channels", "num_classes")
       for name in ("resnet10", "resnet18", "resnet34", "resnet50")},
}


# 3D segmentation: logits (N, classes, D, H, W) at the input's size; defaults for the arguments MONAI requires
SEGMENTERS: dict[str, tuple[str, str, str]] = {
    name: ("spatial_dims", "in_channels", "out_channels") for name in ("UNet", "SegResNet", "BasicUNet")}
SEGMENTER_DEFAULTS: dict[str, dict[str, Any]] = {
    "UNet": {"channels": (16, 32, 64, 128), "strides": (2, 2, 2), "num_res_units": 2}, "SegResNet": {},
    "BasicUNet": {}}


class PatchInference(nn.Module):
    """A 3D segmenter trained on patches (data.args.patch): in training, and on an input of the patch's size, the
    network itself; in evaluation on a larger volume, MONAI's sliding_window_inference over it (windows of the patch,
    a quarter overlapping, blended with Gaussian weights), so a volume of any size fits the memory of a patch. An
    export (tracing) sees the network itself."""

    def __init__(self, net: nn.Module, roi: tuple[int, ...]) -> None:
        super().__init__()
        self.net, self.roi = net, tuple(roi)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or tuple(x.shape[2:]) == self.roi or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return self.net(x)
        from monai.inferers import sliding_window_inference

        return sliding_window_inference(x, self.roi, sw_batch_size=1, predictor=self.net, overlap=0.25,
                                        mode="gaussian")


@dataclass(frozen=True)
class Role:
    """What the family builds for a task: its networks (name -> MONAI's argument names), the word for them, the
    default, and whether the model slides over whole volumes at evaluation (a segmenter trained on patches)."""

    networks: dict[str, tuple[str, str, str]]
    what: str
    default: str
    whole_volumes: bool


ROLES = {  # by task: the tasks this family serves are these keys
    "classification": Role(CLASSIFIERS, "classifier", "DenseNet121", whole_volumes=False),
    "segmentation": Role(SEGMENTERS, "segmenter", "UNet", whole_volumes=True),
}
VOLUMES = DataFit(
    "classification or segmentation of volumes (float C,D,H,W inputs: data.source volumes)",
    lambda info: info.input_dtype == "float32" and len(info.input_shape) == 4, tuple(ROLES),
)


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


@register_model("monai", fits=VOLUMES)
def monai_network(info: DataInfo, arch: Optional[str] = None, **net_args: Any) -> tuple[nn.Module, InputSpec]:
    """arch: a MONAI network (a classifier for classification, DenseNet121 by default; a segmenter for
    segmentation, UNet by default); net_args: its own arguments."""
    import monai.networks.nets as nets

    role = ROLES[info.task]
    table, what = role.networks, role.what
    arch = arch or role.default
    if arch not in table:
        raise UserError(f"model.args.arch: {arch!r} is not a MONAI volume {what} trainforge builds; choose one of "
                        f"{', '.join(table)}")
    net = getattr(nets, arch)
    dims, channels, classes = table[arch]
    net_args = {**SEGMENTER_DEFAULTS.get(arch, {}), **net_args}
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
    check_downsampling(model, tuple(info.input_shape[1:]), arch)
    if role.whole_volumes:  # trained on patches of info's size, evaluated on whole volumes
        model = PatchInference(model, tuple(info.input_shape[1:]))
    return model, input_spec(info)


def _after(side: int, layer: nn.Module) -> int:
    """A side of `side` voxels after one convolution or pooling layer (PyTorch's output-size formula)."""
    def one(v: Any, i: int) -> int:
        return int(v[i] if isinstance(v, (tuple, list)) else v)

    k, st = layer.kernel_size, layer.stride
    pad, dil = getattr(layer, "padding", 0), getattr(layer, "dilation", 1)
    if isinstance(pad, str):  # "same": the size is kept
        return side
    return (side + 2 * one(pad, 0) - one(dil, 0) * (one(k, 0) - 1) - 1) // one(st, 0) + 1


def check_downsampling(model: nn.Module, spatial: tuple[int, ...], arch: str) -> None:
    """A volume of `spatial` voxels must keep at least one voxel a side through every strided convolution and
    pooling of the network (in the order they are built, which is the order they run); else one line naming
    data.args.size and the smallest size that works, before any tensor is made."""
    shrinking = (nn.Conv3d, nn.MaxPool3d, nn.AvgPool3d, nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)
    layers = [m for m in model.modules() if isinstance(m, shrinking)]

    def survives(side: int) -> bool:
        for layer in layers:
            side = _after(side, layer)
            if side < 1:
                return False
        return True

    if all(survives(n) for n in spatial):
        return
    smallest = next((n for n in range(1, 4097) if survives(n)), None)
    need = f"at least {smallest} voxels a side" if smallest else "a larger volume"
    raise UserError(f"data.args.size: {list(spatial)} is too small for MONAI's {arch}: its convolutions and pooling "
                    f"downsample a side of {min(spatial)} voxels below one voxel; use {need} (or a smaller network)")
