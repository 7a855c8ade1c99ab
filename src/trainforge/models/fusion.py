"""`model.name: fusion`: one encoder per input of a multimodal sample (data.source: multimodal), fused, then a head.

    model:
      name: fusion
      args:
        fuse: concat            # concat (late fusion) | attention (self-attention across the modalities' tokens)
        width: 64               # each encoder's output
        image_encoder: cnn      # cnn (a small conv net) | timm:<name> (a timm backbone, pooled)
        image_pretrained: false # timm's weights for a timm encoder (offline-first, as model.name: timm)
        hidden: [64]            # the features' MLP
        dropout: 0.1

Images go through the image encoder (one per image input), the feature vector (and the `present` mask, under
`missing: zero`) through an MLP each. `concat` joins the encodings and a 2-layer head classifies; `attention` takes
them as one token per modality (plus a learnt embedding of which one), runs a transformer encoder layer across them
(each modality attends to the others) and classifies the mean token. An encoder is frozen like any weights
(`train.freeze: ["encoders.camera.*"]`); its parameters are named `encoders.<input>.*`.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec, NamedInputs
from trainforge.models.zoo import DataFit, register_model

MULTIMODAL = DataFit("classification of several named inputs (data.source: multimodal)",
                     lambda info: len(info.inputs) >= 1 and all(i.modality in ENCODED for i in info.inputs),
                     ("classification",))
ENCODED = ("image", "tabular")  # the inputs' modalities an encoder is built for: a CNN (or timm) and an MLP
FUSIONS = ("concat", "attention")


def conv_encoder(channels: int, side: int, width: int) -> nn.Module:
    """Four conv-BN-ReLU stages, each halving the map while it is wider than 2 (so batch norm sees more than one
    value per channel even in a batch of one), then global average pooling and a projection to `width`."""
    layers: list[nn.Module] = []
    c = channels
    for out in (16, 32, 64, 64):
        stride = 2 if side > 2 else 1
        layers += [nn.Conv2d(c, out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(out),
                   nn.ReLU(inplace=True)]
        c, side = out, -(-side // stride)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, width))


def timm_encoder(arch: str, channels: int, width: int, pretrained: bool) -> nn.Module:
    import timm

    if not timm.is_model(arch):
        raise UserError(f"model.args.image_encoder: 'timm:{arch}' names no timm model; see timm.list_models()")
    body = timm.create_model(arch, pretrained=pretrained, num_classes=0, in_chans=channels)
    return nn.Sequential(body, nn.Linear(body.num_features, width))


def mlp(inputs: int, hidden: Sequence[int], width: int, dropout: float) -> nn.Module:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(inputs, h), nn.GELU(), nn.Dropout(dropout)]
        inputs = h
    return nn.Sequential(*layers, nn.Linear(inputs, width))


class FusionNet(nn.Module):
    def __init__(self, encoders: dict[str, nn.Module], width: int, num_classes: int, fuse: str, dropout: float) -> None:
        super().__init__()
        self.names = list(encoders)
        self.encoders = nn.ModuleDict(encoders)
        self.fuse = fuse
        if fuse == "attention":
            self.modality = nn.Parameter(torch.zeros(len(encoders), width))
            self.mixer = nn.TransformerEncoderLayer(width, nhead=max(1, width // 32), dim_feedforward=2 * width,
                                                    dropout=dropout, batch_first=True, norm_first=True)
            self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, num_classes))
        else:
            self.head = nn.Sequential(nn.GELU(), nn.Dropout(dropout), nn.Linear(width * len(encoders), width),
                                      nn.GELU(), nn.Linear(width, num_classes))

    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        encoded = [self.encoders[name](inputs[name]) for name in self.names]
        if self.fuse == "attention":
            tokens = torch.stack(encoded, dim=1) + self.modality
            return self.head(self.mixer(tokens).mean(dim=1))
        return self.head(torch.cat(encoded, dim=1))


@register_model("fusion", fits=MULTIMODAL)
def build_fusion(info: DataInfo, fuse: str = "concat", width: int = 64, image_encoder: str = "cnn",
                 image_pretrained: bool = False, hidden: Sequence[int] = (64,),
                 dropout: float = 0.1) -> tuple[nn.Module, Any]:
    """fuse: concat | attention; width: each encoder's output; image_encoder: cnn | timm:<name>."""
    fuse = check.choice("fuse", fuse, list(FUSIONS))
    hidden = check.int_list("hidden", hidden, allow_empty=True)
    dropout = check.probability("dropout", dropout)
    if not isinstance(width, int) or not 1 <= width <= 4096:
        raise UserError(f"model.args.width: must be an integer 1..4096, got {width!r}")
    if not (image_encoder == "cnn" or (isinstance(image_encoder, str) and image_encoder.startswith("timm:"))):
        raise UserError(f"model.args.image_encoder: {image_encoder!r}; choose cnn or timm:<name>")
    encoders: dict[str, nn.Module] = {}
    for one in info.inputs:
        if len(one.shape) == 3:  # an image (C, H, W); a feature vector (F,) otherwise
            channels = one.shape[0]
            encoders[one.name] = (conv_encoder(channels, min(one.shape[1:]), width) if image_encoder == "cnn" else
                                  timm_encoder(image_encoder.removeprefix("timm:"), channels, width, image_pretrained))
        else:
            encoders[one.name] = mlp(one.shape[0], hidden, width, dropout)
    specs = NamedInputs(tuple((i.name, InputSpec(tuple(i.shape), torch.float32)) for i in info.inputs))
    return FusionNet(encoders, width, info.num_classes, fuse, dropout), specs
