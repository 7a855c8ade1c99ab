"""`resnet`: a CIFAR-style ResNet (depth 6n+2) or a torchvision ImageNet ResNet, untrained or pretrained.

    model: {name: resnet, args: {depth: 20, width: 1}}                    # CIFAR ResNet-20, widths 16/32/64
    model: {name: resnet, args: {arch: resnet18}}                         # torchvision resnet18, random weights
    model: {name: resnet, args: {arch: resnet50, weights: DEFAULT}}       # torchvision's best ImageNet weights
    model: {name: resnet, args: {arch: resnet50, weights: IMAGENET1K_V1}} # a named set of them
    model: {name: resnet, args: {arch: resnet50, weights: /data/r50.pth}} # a state dict on disk

Named weights come from torch's hub cache (~/.cache/torch/hub/checkpoints, or $TORCH_HOME), else are
downloaded when the network allows; neither is one line saying how to fetch them. The classifier is sized
to the data's classes (a pretrained one of another size is trained anew) and the first conv to its channels
(pretrained RGB filters summed for one channel, repeated for more). On the meta device or under fake
tensors (the planner), no weights are read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.confine import local_path
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec, materializing
from trainforge.models.zoo import IMAGE_CLASSIFICATION, input_spec, register_model

ARCHS = ("resnet18", "resnet34", "resnet50")  # torchvision.models builders of these names
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


def torchvision_resnet(arch: str, in_channels: int, num_classes: int, weights: Optional[str] = None) -> nn.Module:
    import torchvision  # heavy (about 1.8 s, torch._dynamo included): of this module, only the torchvision ResNets need it

    model = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    if in_channels != model.conv1.in_channels:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    if weights is not None and materializing():
        load_pretrained(model, pretrained_state(arch, weights), in_channels)
    return model


def pretrained_state(arch: str, weights: str, key: str = "model.args.weights") -> dict[str, torch.Tensor]:
    """The state dict `weights` names: a file, or one of torchvision's weight sets (DEFAULT, IMAGENET1K_V1...);
    `key`: the setting that named it, in messages."""
    path = Path(weights).expanduser()
    if path.suffix in (".pth", ".pt", ".bin", ".safetensors") or path.exists():
        path = local_path(weights, key)  # a job re-checks it against the server's data roots
        if not path.is_file():
            raise UserError(f"{key}: {path} is not a file; point it at a state dict of {arch} "
                            "or name torchvision weights (DEFAULT, IMAGENET1K_V1, ...)")
        try:
            state = load_file(str(path)) if path.suffix == ".safetensors" else torch.load(path, map_location="cpu",
                                                                                            weights_only=True)
        except Exception as e:  # noqa: BLE001 - unpickling and zip errors share no narrower base
            raise UserError(f"{key}: {path} is not a readable state dict ({type(e).__name__})") from None
        return state.get("state_dict", state) if isinstance(state, dict) else {}
    import torchvision  # heavy (about 1.8 s): only torchvision's own weight sets need it

    enum = torchvision.models.get_model_weights(arch)
    names = [w.name for w in enum]
    if weights != "DEFAULT" and weights not in names:
        raise UserError(f"{key}: {weights!r} is not a weight set of {arch}; choose DEFAULT, "
                        f"{', '.join(names)} or a path to a state dict")
    chosen = enum.DEFAULT if weights == "DEFAULT" else enum[weights]
    try:
        return chosen.get_state_dict(progress=False, check_hash=True)
    except (OSError, RuntimeError) as e:  # no network: URLError is an OSError
        cache = Path(torch.hub.get_dir()) / "checkpoints"
        raise UserError(f"{key}: torchvision's {arch} {chosen.name} weights are not in {cache} and "
                        f"could not be downloaded ({str(e).strip().splitlines()[0][:100] or type(e).__name__}); "
                        f"copy {chosen.url.rsplit('/', 1)[-1]} there from a machine with network, or point "
                        f"{key} at the file") from None


def load_pretrained(model: nn.Module, state: dict[str, torch.Tensor], in_channels: int) -> None:
    """Load a pretrained state into `model`, fitting the first conv to `in_channels` and leaving out a classifier
    of another size; a state of another architecture is one line."""
    own = model.state_dict()
    stem = state.get("conv1.weight")
    if stem is not None and stem.shape[1] != in_channels:
        state = {**state, "conv1.weight": _adapt_channels(stem, in_channels)}
    fitting = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    body = [k for k in own if not k.startswith("fc.")]
    missing = [k for k in body if k not in fitting]
    extra = [k for k in state if k not in own and not k.startswith("fc.")]
    if missing or extra:
        example = missing[0] if missing else extra[0]
        raise UserError(f"model.args.weights: the state dict does not fit this ResNet ({len(missing)} of {len(body)} "
                        f"tensors missing or of another shape, {len(extra)} extra, e.g. {example}); use weights "
                        "of the same arch")
    model.load_state_dict(fitting, strict=False)


def _adapt_channels(weight: torch.Tensor, channels: int) -> torch.Tensor:
    """RGB filters for `channels` inputs: summed for 1 (a gray image excites them as before), else repeated and
    scaled so that the response keeps its size (as timm does)."""
    if channels == 1:
        return weight.sum(dim=1, keepdim=True)
    repeat = -(-channels // weight.shape[1])
    return weight.repeat(1, repeat, 1, 1)[:, :channels] * (weight.shape[1] / channels)


@register_model("resnet", fits=IMAGE_CLASSIFICATION)
def build_resnet(
    info: DataInfo, depth: Optional[int] = None, width: float = 1, arch: Optional[str] = None,
    weights: Optional[str] = None,
) -> tuple[nn.Module, InputSpec]:
    c = info.input_shape[0]
    if weights is not None and arch is None:
        raise UserError("model.args.weights: pretrained weights exist for the torchvision ResNets; set "
                        f"model.args.arch to one of {', '.join(ARCHS)}")
    if arch is not None:
        arch = check.choice("arch", arch, list(ARCHS))
        if depth is not None or width != 1:
            key = "depth" if depth is not None else "width"
            raise UserError(f"model.args.{key}: only for the CIFAR ResNet; remove it or remove model.args.arch")
        return torchvision_resnet(arch, c, info.num_classes, None if weights is None else str(weights)), input_spec(info)
    depth = check.positive_int("depth", DEFAULT_DEPTH if depth is None else depth)
    if depth < 8 or (depth - 2) % 6:
        raise UserError(
            f"model.args.depth: CIFAR ResNets have depth 6n+2 (8, 14, 20, 32, 44, 56, 110), got {depth}; "
            f"or set model.args.arch to one of {', '.join(ARCHS)}"
        )
    width = check.positive_number("width", width)
    return CifarResNet(c, depth, width, info.num_classes), input_spec(info)
