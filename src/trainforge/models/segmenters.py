"""`segmenter`: torchvision's semantic segmentation models (issue 28), built by torchvision's own builders.

    model: {name: segmenter, args: {arch: deeplabv3_mobilenet_v3_large}}               # COCO-with-VOC-labels weights
    model: {name: segmenter, args: {arch: lraspp_mobilenet_v3_large, pretrained: false}}

arch: deeplabv3_resnet50, deeplabv3_resnet101, deeplabv3_mobilenet_v3_large, fcn_resnet50, fcn_resnet101,
lraspp_mobilenet_v3_large. pretrained (true): torchvision's weights (trained on COCO's images with VOC's 21
classes; offline-first from torch's hub cache, a missing file is one line) with the classifier's last layer new and
sized to the data's classes, or a state dict file of the arch; backbone_weights: ImageNet weights for the backbone
alone (with pretrained false). The model returns the logits (N, classes, H, W) at its input's size (torchvision's
`out`; the auxiliary head is not built) and normalizes its input with ImageNet's statistics itself, as the weights
expect: the data's images come in [0, 1] (recipes set data.normalize: none), the exported model takes them so too.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec, materializing
from trainforge.models.detectors import load_matching
from trainforge.models.resnet import pretrained_state
from trainforge.models.zoo import DataFit, input_spec, register_model
from trainforge.weights import segmenter_backbone

ARCHS = ("deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "deeplabv3_resnet101", "fcn_resnet50", "fcn_resnet101",
         "lraspp_mobilenet_v3_large")
IMAGENET_MEAN = (0.485, 0.456, 0.406)  # what torchvision's weights were trained on (their transforms' mean, std)
IMAGENET_STD = (0.229, 0.224, 0.225)
SEGMENTATION = DataFit("semantic segmentation (task segmentation: C,H,W images with a mask)",
                       lambda info: info.input_dtype == "float32" and len(info.input_shape) == 3, ("segmentation",))


class Segmenter(nn.Module):
    """A torchvision segmentation model that takes [0, 1] images and returns its `out` logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model((images - self.mean) / self.std)["out"]


class OneImageNorm(nn.BatchNorm2d):
    """DeepLabV3's image-pooling branch normalizes one value per channel and image: a training micro-batch of one
    image (what `micro_batch_size: auto` may choose, and the planner simulates) gives BatchNorm nothing to
    normalize over, and torch refuses it. This BatchNorm normalizes such a batch with its running statistics, as
    in evaluation, and any larger one as BatchNorm does; its weights and statistics are the pretrained ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] * x.shape[2] * x.shape[3] == 1:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False,
                                            0.0, self.eps)
        return super().forward(x)


def one_image_pooling(model: nn.Module) -> None:
    """Every ASPP image-pooling BatchNorm of `model` made a OneImageNorm (in place: same parameters and buffers)."""
    from torchvision.models.segmentation.deeplabv3 import ASPPPooling

    for module in model.modules():
        if isinstance(module, ASPPPooling):
            for child in module:
                if type(child) is nn.BatchNorm2d:
                    child.__class__ = OneImageNorm


@register_model("segmenter", fits=SEGMENTATION)
def build_segmenter(info: DataInfo, arch: str = "deeplabv3_mobilenet_v3_large", pretrained: Any = True,
                    backbone_weights: bool = False) -> tuple[nn.Module, InputSpec]:
    import torchvision  # heavy (about 1.8 s): only a segmentation run needs it

    arch = check.choice("arch", arch, list(ARCHS))
    if not isinstance(pretrained, (bool, str)):
        raise UserError(f"model.args.pretrained: true (torchvision's weights), false, or a state dict file or weight "
                        f"set name, got {pretrained!r}")
    if info.input_shape[0] != 3:
        raise UserError(f"model.name: segmenter takes RGB images (3 channels), the data has {info.input_shape[0]}")
    if pretrained is not False and backbone_weights:
        raise UserError("model.args.backbone_weights: the pretrained weights include the backbone's; set pretrained: "
                        "false to start from ImageNet backbone weights alone")
    model = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=info.num_classes,
                                         aux_loss=False) if "lraspp" not in arch else \
        torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=info.num_classes)
    if materializing():
        if pretrained is not False:
            state = pretrained_state(arch, "DEFAULT" if pretrained is True else str(pretrained), "model.args.pretrained")
            load_matching(model, {k: v for k, v in state.items() if not k.startswith("aux_classifier.")}, arch)
        elif backbone_weights:
            body = segmenter_backbone(arch)  # declared with what the family loads (trainforge/weights.py)
            state = pretrained_state(body, "DEFAULT", "model.args.backbone_weights")
            # the backbone is the classifier's feature layers: a MobileNet's `features.*`, a ResNet's own names
            load_matching(model.backbone, {k.removeprefix("features."): v for k, v in state.items()}, body)
    one_image_pooling(model)
    return Segmenter(model), input_spec(info)
