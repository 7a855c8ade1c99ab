"""`resnet`: a CIFAR-style ResNet (depth 6n+2) or a torchvision ImageNet ResNet, always untrained.

    model: {name: resnet, args: {depth: 20, width: 1}}      # CIFAR ResNet-20, widths 16/32/64
    model: {name: resnet, args: {arch: resnet18}}           # torchvision.models.resnet18(weights=None)

The torchvision architectures get their first conv rebuilt for the data's channel count; no
weights are ever downloaded.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torchvision
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec
from trainforge.models.zoo import IMAGE_CLASSIFICATION, input_spec, register_model

ARCHS: dict[str, Callable[..., torchvision.models.ResNet]] = {
    "resnet18": torchvision.models.resnet18,
    "resnet34": torchvision.models.resnet34,
    "resnet50": torchvision.models.resnet50,
}
DEFAULT_DEPTH = 20


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:  # projection shortcut ("option B") where the shape changes
            projection = nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)
            self.shortcut = nn.Sequential(projection, nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + self.shortcut(x))


class CifarResNet(nn.Module):
    """He et al. 2016, section 4.2: three stages of n basic blocks at widths 16/32/64 (x width)."""

    def __init__(self, in_channels: int, depth: int, width: float, num_classes: int) -> None:
        super().__init__()
        blocks_per_stage = (depth - 2) // 6
        widths = [max(1, round(base * width)) for base in (16, 32, 64)]
        stem_conv = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.stem = nn.Sequential(stem_conv, nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        c_in = widths[0]
        for stage, c_out in enumerate(widths):
            for i in range(blocks_per_stage):
                layers.append(BasicBlock(c_in, c_out, stride=2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


def torchvision_resnet(arch: str, in_channels: int, num_classes: int) -> nn.Module:
    model = ARCHS[arch](weights=None, num_classes=num_classes)
    if in_channels != model.conv1.in_channels:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


@register_model("resnet", fits=IMAGE_CLASSIFICATION)
def build_resnet(
    info: DataInfo, depth: Optional[int] = None, width: float = 1, arch: Optional[str] = None
) -> tuple[nn.Module, InputSpec]:
    c = info.input_shape[0]
    if arch is not None:
        arch = check.choice("arch", arch, list(ARCHS))
        if depth is not None or width != 1:
            key = "depth" if depth is not None else "width"
            raise UserError(f"model.args.{key}: only for the CIFAR ResNet; remove it or remove model.args.arch")
        return torchvision_resnet(arch, c, info.num_classes), input_spec(info)
    depth = check.positive_int("depth", DEFAULT_DEPTH if depth is None else depth)
    if depth < 8 or (depth - 2) % 6:
        raise UserError(
            f"model.args.depth: CIFAR ResNets have depth 6n+2 (8, 14, 20, 32, 44, 56, 110), got {depth}; "
            f"or set model.args.arch to one of {', '.join(ARCHS)}"
        )
    width = check.positive_number("width", width)
    return CifarResNet(c, depth, width, info.num_classes), input_spec(info)
