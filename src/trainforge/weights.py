"""What each model family loads from outside a run, declared once (torch-free): the config, the job admission and the
launcher's job files ask here, and the families' builders take their backbones' names from here too.

    sources(cfg.model.name, cfg.model.args)      # [Source(field, value, kind, arch)] the model section loads
    from_model_sources(cfg.data.from_model)      # the same for the data's tokenizer or preprocessing
    preprocessing_source(cfg.model.name, cfg.model.args)   # {family, source, weights, ...} for data.from_model
    remote_code_fields(cfg)                      # the settings that opt in to a model folder's own code

A source's `kind` says where it comes from and how it is judged before anything is loaded:
- `hf`: a Hugging Face hub id or a folder that save_pretrained wrote;
- `timm`: timm's own weights of the architecture `value` (the Hugging Face cache, or torch's for older URL weights);
- `torchvision`: the weight set `value` (DEFAULT, IMAGENET1K_V1, ...) of the torchvision model `arch`;
- `file`: a weights file (a state dict);
- `name`: an architecture name whose library reads nothing for it (timm's preprocessing config of `value`);
- `inline`: a transformers config given as a mapping (it may name no file).

A family that loads nothing has no entry. A plug-in family declares its own with `declare_loads(name)`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from trainforge.errors import UserError

WEIGHT_SET = re.compile(r"[A-Za-z0-9_]{1,96}")  # DEFAULT, IMAGENET1K_V2: a torchvision weight set, not a file
TIMM_PREFIX = "timm:"  # a detector's `backbone: timm:<name>`


@dataclass(frozen=True)
class Source:
    field: str  # the setting that names it: "model.args.pretrained"
    value: Any  # a string; a mapping for `inline`
    kind: str  # hf, timm, torchvision, file, name, inline (above)
    arch: Optional[str] = None  # torchvision: whose weight set
    library: Optional[str] = None  # name: whose model name it is (timm, torchvision)


Declaration = Callable[[dict[str, Any]], list[Source]]
LOADS: dict[str, Declaration] = {}  # model family -> what its model.args load
PREPROCESSING: dict[str, Callable[[dict[str, Any]], Optional[dict[str, Any]]]] = {}  # family -> data.from_model


def declare_loads(family: str, preprocessing: Optional[Callable[[dict[str, Any]], Optional[dict[str, Any]]]] = None
                  ) -> Callable[[Declaration], Declaration]:
    """Declare what model family `family` loads (a decorator on `args -> [Source]`), and optionally whose
    preprocessing or tokenizer it implies (`args -> {family, source, weights, trust_remote_code}` or None)."""

    def decorator(fn: Declaration) -> Declaration:
        assert family not in LOADS, f"model family {family!r} declared twice"
        LOADS[family] = fn
        if preprocessing is not None:
            PREPROCESSING[family] = preprocessing
        return fn

    return decorator


def sources(family: str, args: dict[str, Any]) -> list[Source]:
    """What a model section loads (UserError, public, naming a setting of the wrong type)."""
    declared = LOADS.get(family)
    return [] if declared is None else declared(args)


def from_model_sources(source: Any) -> list[Source]:
    """What data.from_model {family, source, weights} loads: an hf tokenizer or processor, or nothing but a name (timm,
    torchvision: the preprocessing is the library's table) and, for torchvision, the weight set or file it names."""
    if source is None:
        return []
    found = [Source("data.from_model.source", source.source, "hf" if source.family == "hf" else "name",
                    library=source.family)]
    if source.weights is not None:
        found.append(weight_source("data.from_model.weights", source.weights, source.source))
    return found


def weight_source(field: str, value: str, arch: Optional[str]) -> Source:
    """A torchvision weight set's name, else a file."""
    if WEIGHT_SET.fullmatch(value):
        return Source(field, value, "torchvision", arch)
    return Source(field, value, "file")


def preprocessing_source(family: str, args: dict[str, Any]) -> Optional[dict[str, Any]]:
    """data.from_model as the model section implies it (`{family, source, weights, trust_remote_code}`), or None."""
    declared = PREPROCESSING.get(family)
    return None if declared is None else declared(args)


def remote_code_fields(model_name: str, model_args: dict[str, Any], from_model: Any) -> list[str]:
    """The settings of a config that opt in to running a model folder's own code."""
    fields = []
    if model_args.get("trust_remote_code") is True:
        fields.append("model.args.trust_remote_code")
    if from_model is not None and from_model.trust_remote_code:
        fields.append("data.from_model.trust_remote_code")
    return fields


def _refuse(field: str, expected: str) -> UserError:
    return UserError(f"{field}: expected {expected}", public=True)


# ---- the shipped families ------------------------------------------------------------------------------------


def _hf_preprocessing(args: dict[str, Any]) -> Optional[dict[str, Any]]:
    source = args.get("pretrained") or args.get("config")
    if isinstance(source, str) and source:
        return {"family": "hf", "source": source, "trust_remote_code": args.get("trust_remote_code") is True}
    return None


@declare_loads("hf", _hf_preprocessing)
def _hf(args: dict[str, Any]) -> list[Source]:
    found = []
    pretrained = args.get("pretrained", False)
    if isinstance(pretrained, str) and pretrained:
        found.append(Source("model.args.pretrained", pretrained, "hf"))
    elif not isinstance(pretrained, (bool, str)) and pretrained is not None:
        raise _refuse("model.args.pretrained", "a hub id, a folder under a data root or false")
    config = args.get("config")
    if isinstance(config, str):
        found.append(Source("model.args.config", config, "hf"))
    elif isinstance(config, dict):
        found.append(Source("model.args.config", config, "inline"))
    elif config is not None:
        raise _refuse("model.args.config", "a hub id, a folder under a data root or an inline mapping")
    return found


def _timm_preprocessing(args: dict[str, Any]) -> Optional[dict[str, Any]]:
    arch = args.get("arch")
    return {"family": "timm", "source": arch} if isinstance(arch, str) else None


@declare_loads("timm", _timm_preprocessing)
def _timm(args: dict[str, Any]) -> list[Source]:
    arch, pretrained = args.get("arch"), args.get("pretrained", False)
    found = [Source("model.args.arch", arch, "name", library="timm")] if isinstance(arch, str) else []
    if pretrained is True and isinstance(arch, str):
        found.append(Source("model.args.pretrained", arch, "timm"))
    elif isinstance(pretrained, str):
        found.append(Source("model.args.pretrained", pretrained, "file"))
    elif not isinstance(pretrained, bool) and pretrained is not None:
        raise _refuse("model.args.pretrained", "true, false or a weights file under a data root")
    return found


def _resnet_preprocessing(args: dict[str, Any]) -> Optional[dict[str, Any]]:
    arch, weights = args.get("arch"), args.get("weights")
    if not isinstance(arch, str):
        return None
    named = isinstance(weights, str) and WEIGHT_SET.fullmatch(weights) is not None  # a weight set, not a path
    return {"family": "torchvision", "source": arch, "weights": weights if named else "DEFAULT"}


@declare_loads("resnet", _resnet_preprocessing)
def _resnet(args: dict[str, Any]) -> list[Source]:
    weights = args.get("weights")
    if weights is None:
        return []
    if not isinstance(weights, str) or not weights:
        raise _refuse("model.args.weights", "a torchvision weight-set name (DEFAULT, IMAGENET1K_V1) or a state-dict "
                                            "file under a data root")
    return [weight_source("model.args.weights", weights, args.get("arch") if isinstance(args.get("arch"), str) else None)]


# torchvision's detection and segmentation models: the defaults their builders take (models/detectors.py and
# models/segmenters.py read them from here; tests/models hold the two together)
DETECTOR_DEFAULTS = {"arch": "fasterrcnn_mobilenet_v3_large_fpn", "pretrained": True, "backbone_weights": False}
SEGMENTER_DEFAULTS = {"arch": "deeplabv3_mobilenet_v3_large", "pretrained": True, "backbone_weights": False}


def detector_backbone(arch: str, backbone: Optional[str] = None) -> str:
    """The torchvision classifier whose ImageNet weights a detector's backbone takes (backbone_weights: true)."""
    if backbone is not None:
        return backbone
    return "mobilenet_v3_large" if "mobilenet" in arch else "vgg16" if "vgg" in arch else "resnet50"


def segmenter_backbone(arch: str) -> str:
    """The torchvision classifier whose ImageNet weights a segmenter's backbone takes (backbone_weights: true)."""
    return "mobilenet_v3_large" if "mobilenet" in arch else arch.split("_", 1)[1]


def _torchvision_dense(args: dict[str, Any], defaults: dict[str, Any], backbone_of: Callable[[dict[str, Any], str], Optional[Source]]) -> list[Source]:
    arch = args.get("arch", defaults["arch"])
    pretrained = args.get("pretrained", defaults["pretrained"])
    if not isinstance(arch, str):
        return []  # the builder names the archs
    found = []
    if pretrained is True:
        found.append(Source("model.args.pretrained", "DEFAULT", "torchvision", arch))
    elif isinstance(pretrained, str) and pretrained:
        found.append(weight_source("model.args.pretrained", pretrained, arch))
    elif not isinstance(pretrained, bool):
        raise _refuse("model.args.pretrained", "true (torchvision's weights), false, or a state dict file or weight "
                                               "set name")
    if args.get("backbone_weights", defaults["backbone_weights"]) not in (False, None):
        body = backbone_of(args, arch)
        if body is not None:
            found.append(body)
    return found


def _detector_body(args: dict[str, Any], arch: str) -> Optional[Source]:
    weights, backbone = args.get("backbone_weights"), args.get("backbone")
    field = "model.args.backbone_weights"
    if isinstance(backbone, str) and backbone.startswith(TIMM_PREFIX):
        name = backbone[len(TIMM_PREFIX):]
        return Source(field, name, "timm") if weights is True else Source(field, weights, "file") \
            if isinstance(weights, str) else None
    if weights is not True:
        raise _refuse(field, "true or false (a state dict file only for a timm backbone)")
    return Source(field, "DEFAULT", "torchvision", detector_backbone(arch, backbone if isinstance(backbone, str)
                                                                     else None))


def _segmenter_body(args: dict[str, Any], arch: str) -> Optional[Source]:
    if args.get("backbone_weights") is not True:
        raise _refuse("model.args.backbone_weights", "true or false")
    return Source("model.args.backbone_weights", "DEFAULT", "torchvision", segmenter_backbone(arch))


@declare_loads("detector")
def _detector(args: dict[str, Any]) -> list[Source]:
    return _torchvision_dense(args, DETECTOR_DEFAULTS, _detector_body)


@declare_loads("segmenter")
def _segmenter(args: dict[str, Any]) -> list[Source]:
    return _torchvision_dense(args, SEGMENTER_DEFAULTS, _segmenter_body)


@declare_loads("fusion")
def _fusion(args: dict[str, Any]) -> list[Source]:
    encoder = args.get("image_encoder", "cnn")
    if not (isinstance(encoder, str) and encoder.startswith(TIMM_PREFIX)):
        return []
    name = encoder[len(TIMM_PREFIX):]
    found = [Source("model.args.image_encoder", name, "name", library="timm")]
    if args.get("image_pretrained") is True:
        found.append(Source("model.args.image_pretrained", name, "timm"))
    return found
