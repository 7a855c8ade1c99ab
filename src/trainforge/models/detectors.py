"""`detector`: torchvision's object detectors (issue 28), built by torchvision's own builders, trained with the losses
they compute themselves.

    model: {name: detector, args: {arch: fasterrcnn_mobilenet_v3_large_fpn}}                 # COCO weights (offline-first)
    model: {name: detector, args: {arch: retinanet_resnet50_fpn, pretrained: false}}         # no weights at all
    model: {name: detector, args: {arch: fasterrcnn_resnet50_fpn, backbone: resnet18,
                                   anchor_sizes: [8, 16, 32, 64, 128], pretrained: false}}  # a small one

arch: a torchvision detection builder (ARCHS). pretrained (true): its COCO weights (or a state dict file of the arch,
or a weight set's name), the class head new and sized to the data's classes (every tensor of another shape is left as built, the rest loaded); they are read from torch's
hub cache and downloaded only when missing there, a missing file without network is one line naming where to copy
it. backbone_weights (false): ImageNet weights for the backbone alone (with pretrained false).
backbone: another torchvision ResNet under the FPN (resnet18, resnet34, resnet50, resnet101) for Faster R-CNN,
RetinaNet and FCOS: small and fast where a few classes of simple objects need no ResNet-50; or any timm CNN that
gives features at strides 8, 16 and 32 (`timm:convnext_tiny`, `timm:efficientnet_b0`, ...), its feature maps under
torchvision's FeaturePyramidNetwork, backbone_weights then true (timm's ImageNet weights, offline-first) or a state
dict file of that timm model.
anchor_sizes: one anchor size in pixels per feature level (Faster R-CNN, RetinaNet), for objects much smaller or
larger than COCO's at 800 pixels. options: torchvision's own keyword arguments of the model (e.g. Faster R-CNN's
rpn_post_nms_top_n_train, box_batch_size_per_image, box_detections_per_img), passed as they are. The model's own transform resizes nothing (min_size = max_size = the data's image
size) and normalizes with ImageNet's statistics, as the weights expect; the data's images come in [0, 1]
(recipes set data.normalize: none).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec, materializing
from trainforge.models.resnet import pretrained_state
from trainforge.models.zoo import DataFit, input_spec, register_model
from trainforge.weights import detector_backbone

ARCHS = ("fasterrcnn_mobilenet_v3_large_fpn", "fasterrcnn_mobilenet_v3_large_320_fpn", "fasterrcnn_resnet50_fpn",
         "fasterrcnn_resnet50_fpn_v2", "retinanet_resnet50_fpn", "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn",
         "ssdlite320_mobilenet_v3_large", "ssd300_vgg16")
FAMILIES = ("fasterrcnn", "retinanet", "fcos", "ssdlite", "ssd")  # ssdlite before ssd: the first prefix that fits
BACKBONES = ("resnet18", "resnet34", "resnet50", "resnet101")
TIMM = "timm:"  # backbone: timm:<a timm model name>
FPN_CHANNELS = 256  # torchvision's FPN width, which its detection heads are built for
RATIOS = (0.5, 1.0, 2.0)  # anchor aspect ratios of every level (torchvision's)
OWN_KEYS = {"weights", "weights_backbone", "num_classes", "min_size", "max_size", "size"}
DETECTION = DataFit("object detection (task detection: C,H,W images with boxes)",
                    lambda info: info.input_dtype == "float32" and len(info.input_shape) == 3, ("detection",))


@register_model("detector", fits=DETECTION)
def build_detector(info: DataInfo, arch: str = "fasterrcnn_mobilenet_v3_large_fpn", pretrained: Any = True,
                   backbone_weights: Any = False, backbone: Optional[str] = None,
                   anchor_sizes: Optional[list[int]] = None, trainable_backbone_layers: Optional[int] = None,
                   options: Optional[dict[str, Any]] = None) -> tuple[nn.Module, InputSpec]:
    arch = check.choice("arch", arch, list(ARCHS))
    if not isinstance(pretrained, (bool, str)):
        raise UserError(f"model.args.pretrained: true (torchvision's COCO weights), false, or a state dict file or "
                        f"weight set name, got {pretrained!r}")
    family = next(f for f in FAMILIES if arch.startswith(f))
    if info.input_shape[0] != 3:
        raise UserError(f"model.name: detector takes RGB images (3 channels), the data has {info.input_shape[0]}; "
                        "read the images as RGB")
    if pretrained is True and backbone is not None:
        raise UserError(f"model.args.backbone: {arch}'s COCO weights are for its own backbone; set "
                        "model.args.pretrained: false to train a detector with another one")
    timm_body = isinstance(backbone, str) and backbone.startswith(TIMM)
    if not isinstance(backbone_weights, bool) and not (timm_body and isinstance(backbone_weights, str)):
        raise UserError("model.args.backbone_weights: true or false (a state dict file only for a timm backbone), "
                        f"got {backbone_weights!r}")
    if pretrained and backbone_weights:
        raise UserError("model.args.backbone_weights: the COCO weights include the backbone's; set pretrained: false "
                        "to start from ImageNet backbone weights alone")
    height, width = (int(v) for v in info.input_shape[-2:])
    kwargs: dict[str, Any] = {"num_classes": info.num_classes, "weights": None}
    if family in ("fasterrcnn", "retinanet", "fcos"):  # their transform resizes nothing: the data has the size
        # (SSD300 and SSDlite320 resize to their fixed size inside, whatever the data's)
        kwargs.update(min_size=min(height, width), max_size=max(height, width))
    if trainable_backbone_layers is not None:
        if not isinstance(trainable_backbone_layers, int) or not 0 <= trainable_backbone_layers <= 6:
            raise UserError(f"model.args.trainable_backbone_layers: 0 to 6 (0 freezes the backbone), got "
                            f"{trainable_backbone_layers!r}")
        kwargs["trainable_backbone_layers"] = trainable_backbone_layers
    if anchor_sizes is not None:
        if family not in ("fasterrcnn", "retinanet"):
            raise UserError(f"model.args.anchor_sizes: only for Faster R-CNN and RetinaNet, not {arch}")
        kwargs.update(_anchors(family, anchor_sizes, "timm FPN" if timm_body else backbone or arch))
    if options:
        if not isinstance(options, dict):
            raise UserError(f"model.args.options: a mapping of torchvision's keyword arguments of {arch}, got "
                            f"{options!r}")
        taken = sorted(set(options) & (set(kwargs) | OWN_KEYS))
        if taken:
            raise UserError(f"model.args.options: {', '.join(taken)} set by trainforge or by model.args; remove them "
                            "from options")
        accepted = option_names(family)
        unknown = sorted(set(options) - accepted)
        if unknown:  # torchvision passes unknown keywords on, and its transform ignores them: say so here
            raise UserError(f"model.args.options: {arch} does not take one of {unknown}; it takes "
                            f"{', '.join(sorted(accepted - OWN_KEYS))}")
        kwargs.update(options)
    weights_backbone = "DEFAULT" if backbone_weights is True else (backbone_weights or None)
    try:
        if timm_body:
            model = _with_timm_backbone(arch, family, backbone[len(TIMM):], weights_backbone, kwargs)
        else:
            model = _build(arch, family, backbone, weights_backbone, kwargs)
    except TypeError as e:  # an option the builder does not take
        raise UserError(f"model.args.options: {arch} does not take one of {sorted(options or {})} ({e}); see "
                        "torchvision's documentation of its detection models") from None
    if pretrained is not False and materializing():  # true: torchvision's COCO weights; a string: a file or a set
        key = "model.args.pretrained"
        load_matching(model, pretrained_state(arch, "DEFAULT" if pretrained is True else str(pretrained), key), arch)
    # ONNX: torch.export cannot follow a detector that keeps boxes by their scores (NMS, top-k of a data-dependent
    # count) and takes minutes to say so; the TorchScript tracer exports it in seconds (compression/export.py)
    model.onnx_exporters = ("torchscript",)
    return model, input_spec(info)


def option_names(family: str) -> set[str]:
    """The keyword arguments a family's model class and its image transform take (what `options` may set)."""
    import inspect

    from torchvision.models.detection import FCOS, FasterRCNN, RetinaNet
    from torchvision.models.detection.ssd import SSD
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    cls = {"fasterrcnn": FasterRCNN, "retinanet": RetinaNet, "fcos": FCOS, "ssdlite": SSD, "ssd": SSD}[family]
    names = set()
    for fn in (cls.__init__, GeneralizedRCNNTransform.__init__):
        names |= {p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"}
    return names - {"backbone", "anchor_generator", "rpn_anchor_generator"} | {"trainable_backbone_layers"}


def _build(arch: str, family: str, backbone: Optional[str], weights_backbone: Optional[str],
           kwargs: dict[str, Any]) -> nn.Module:
    import torchvision

    if backbone is not None:
        model = _with_backbone(arch, family, check.choice("backbone", backbone, list(BACKBONES)), weights_backbone,
                               kwargs)
    else:
        kwargs["weights_backbone"] = None
        model = torchvision.models.get_model(arch, **kwargs)
        if weights_backbone is not None and materializing():
            _load_backbone(model, arch)
    return model


def _anchors(family: str, sizes: list[int], what: str) -> dict[str, Any]:
    from torchvision.models.detection.anchor_utils import AnchorGenerator

    levels = 5  # an FPN's levels: P2-P6 (Faster R-CNN) or P3-P7 (RetinaNet); mobilenet's Faster R-CNN has 3
    if "mobilenet" in what:
        levels = 3
    if len(sizes) != levels or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise UserError(f"model.args.anchor_sizes: {what} has {levels} feature levels: give {levels} positive "
                        f"pixel sizes, got {sizes!r}")
    generator = AnchorGenerator(tuple((s,) for s in sizes), (RATIOS,) * levels)
    return {"rpn_anchor_generator" if family == "fasterrcnn" else "anchor_generator": generator}


def _with_backbone(arch: str, family: str, backbone: str, weights: Optional[str], kwargs: dict[str, Any]) -> nn.Module:
    from torchvision.models.detection import FCOS, FasterRCNN, RetinaNet
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    if family not in ("fasterrcnn", "retinanet", "fcos") or "mobilenet" in arch:
        raise UserError(f"model.args.backbone: only Faster R-CNN, RetinaNet and FCOS (resnet50 FPN) take another "
                        f"backbone, not {arch}")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("weights",)}
    layers = kwargs.pop("trainable_backbone_layers", 5 if weights is None else 3)
    num_classes = kwargs.pop("num_classes")
    if family == "fasterrcnn":
        body = resnet_fpn_backbone(backbone_name=backbone, weights=weights, trainable_layers=layers)
        return FasterRCNN(body, num_classes=num_classes, **kwargs)
    extra = LastLevelP6P7(256, 256)
    body = resnet_fpn_backbone(backbone_name=backbone, weights=weights, trainable_layers=layers,
                               returned_layers=[2, 3, 4], extra_blocks=extra)
    return (RetinaNet if family == "retinanet" else FCOS)(body, num_classes=num_classes, **kwargs)


class TimmFPN(nn.Module):
    """A timm CNN's feature maps (features_only) at the strides a detection head expects, under torchvision's
    FeaturePyramidNetwork: what torchvision's detectors take as a backbone (`out_channels`, an OrderedDict of maps)."""

    def __init__(self, body: nn.Module, strides: tuple[int, ...], extra_blocks: Any) -> None:
        from torchvision.ops import FeaturePyramidNetwork

        super().__init__()
        reductions = list(body.feature_info.reduction())
        self.body = body
        self.picked = [reductions.index(s) for s in strides]
        channels = [body.feature_info.channels()[i] for i in self.picked]
        self.fpn = FeaturePyramidNetwork(channels, FPN_CHANNELS, extra_blocks=extra_blocks)
        self.out_channels = FPN_CHANNELS

    def forward(self, x: torch.Tensor) -> Any:
        from collections import OrderedDict

        features = self.body(x)
        return self.fpn(OrderedDict((str(k), features[i]) for k, i in enumerate(self.picked)))


def _with_timm_backbone(arch: str, family: str, name: str, weights: Optional[str], kwargs: dict[str, Any]) -> nn.Module:
    """Faster R-CNN (strides 4-32, then a max-pooled level), RetinaNet or FCOS (strides 8-32, then P6 and P7) on a
    timm CNN's features."""
    import timm  # heavy: only a timm backbone loads it
    from torchvision.models.detection import FCOS, FasterRCNN, RetinaNet
    from torchvision.ops.feature_pyramid_network import LastLevelMaxPool, LastLevelP6P7

    if family not in ("fasterrcnn", "retinanet", "fcos") or "mobilenet" in arch:
        raise UserError(f"model.args.backbone: only Faster R-CNN, RetinaNet and FCOS (resnet50 FPN) take another "
                        f"backbone, not {arch}")
    if not timm.is_model(name):
        raise UserError(f"model.args.backbone: {name!r} is not a timm model; see timm.list_models()")
    try:
        body = _timm_features(timm, name, weights)
    except RuntimeError as e:  # a model without features_only (a ViT without a feature pyramid, say)
        raise UserError(f"model.args.backbone: timm's {name} gives no feature maps ({str(e).splitlines()[0][:120]}); "
                        "choose a CNN (resnet, convnext, efficientnet, regnet ...)") from None
    strides = (4, 8, 16, 32) if family == "fasterrcnn" else (8, 16, 32)
    missing = [s for s in strides if s not in body.feature_info.reduction()]
    if missing:
        raise UserError(f"model.args.backbone: timm's {name} has no feature map at stride {missing[0]} (it has "
                        f"{list(body.feature_info.reduction())}); choose a CNN with the usual four stages")
    layers = kwargs.pop("trainable_backbone_layers", None)
    if layers not in (None, 0):
        raise UserError("model.args.trainable_backbone_layers: with a timm backbone, 0 (frozen) or unset (every "
                        f"layer trained), got {layers}")
    if layers == 0:
        body.requires_grad_(False)
    kwargs = {k: v for k, v in kwargs.items() if k != "weights"}
    num_classes = kwargs.pop("num_classes")
    if family == "fasterrcnn":
        return FasterRCNN(TimmFPN(body, strides, LastLevelMaxPool()), num_classes=num_classes, **kwargs)
    extra = LastLevelP6P7(FPN_CHANNELS, FPN_CHANNELS)
    return (RetinaNet if family == "retinanet" else FCOS)(TimmFPN(body, strides, extra), num_classes=num_classes,
                                                          **kwargs)


def _timm_features(timm: Any, name: str, weights: Optional[str]) -> nn.Module:
    """timm's `name` as a feature extractor; weights: None, "DEFAULT" (timm's own, offline-first) or a file."""
    from trainforge.models.timm_models import _from_hub

    if weights is None or not materializing():
        return timm.create_model(name, pretrained=False, features_only=True)
    if weights == "DEFAULT":
        return _from_hub(timm, name, {"features_only": True})
    from trainforge.confine import local_path

    path = local_path(weights, "model.args.backbone_weights")
    if not path.is_file():
        raise UserError(f"model.args.backbone_weights: {path} is not a file; point it at a state dict of timm's "
                        f"{name}, or use true for timm's own weights")
    model = timm.create_model(name, pretrained=False, features_only=True)
    try:
        state = timm.models.load_state_dict(str(path), weights_only=True)
    except Exception as e:  # noqa: BLE001 - unpickling, zip and safetensors errors share no narrower base
        from trainforge.hub import weights_problem

        problem = weights_problem(e) or (  # timm re-raises torch's refusal of a pickle as a RuntimeError
            "a pickle that holds more than tensors (it would run code), refused by torch.load(weights_only=True)"
            if "weights_only" in str(e) else None)
        if problem is None:
            raise
        raise UserError(f"model.args.backbone_weights: {path} is {problem}; point it at a state dict of timm's "
                        f"{name}", public=True) from None
    own = model.state_dict()
    fitting = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if len(fitting) < 0.9 * len(own):
        raise UserError(f"model.args.backbone_weights: {path} holds {len(fitting)} of the {len(own)} tensors of "
                        f"timm's {name} features; point it at weights of {name}")
    model.load_state_dict(fitting, strict=False)
    return model


def _load_backbone(model: nn.Module, arch: str) -> None:
    """ImageNet weights into the detector's backbone body (a torchvision ResNet-50 or MobileNetV3)."""
    name = detector_backbone(arch)  # declared with what the family loads (trainforge/weights.py)
    state = pretrained_state(name, "DEFAULT")
    body = model.backbone.body if hasattr(model.backbone, "body") else model.backbone
    load_matching(body, state, name, quiet=True)


def load_matching(model: nn.Module, state: dict[str, torch.Tensor], what: str, quiet: bool = False) -> int:
    """Load every tensor of `state` whose name and shape match the model's (the class heads sized to other data
    are left as built); a state that fits less than half of the model is one line. Returns how many were loaded."""
    own = model.state_dict()
    fitting = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    if len(fitting) < len(own) / 2 and not quiet:
        raise UserError(f"model.args.pretrained: the weights of {what} fit {len(fitting)} of the model's "
                        f"{len(own)} tensors; use the weights of the same arch")
    model.load_state_dict(fitting, strict=False)
    return len(fitting)
