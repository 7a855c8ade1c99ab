"""`model.name: timm`: an image classifier from timm, with its pretrained weights or from scratch.

    model:
      name: timm
      args:
        arch: convnext_tiny.fb_in22k        # any name `timm.list_models()` knows, with or without its tag
        pretrained: true                   # timm's weights (the local Hugging Face cache, else the hub)
        # pretrained: /data/weights.safetensors   # or a state dict of this architecture on disk
        # pretrained: false                # random weights

The classifier is sized to the data's classes (a pretrained head of another size is left out and trained
anew) and the stem to its channels (timm adapts pretrained RGB weights to 1 or 4 channels). Built on the meta
device or under fake tensors (the planner, the launcher's checks), no weights are read.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Optional, Union

from torch import nn

from trainforge.data.base import DataInfo
from trainforge.confine import local_path
from trainforge.errors import UserError
from trainforge.hub import hub_offline, weights_problem, why_not_hub
from trainforge.models.base import InputSpec, materializing
from trainforge.models.zoo import IMAGE_CLASSIFICATION, input_spec, register_model


@register_model("timm", fits=IMAGE_CLASSIFICATION)
def timm_model(info: DataInfo, arch: str, pretrained: Union[bool, str] = False,
               drop_rate: float = 0.0) -> tuple[nn.Module, InputSpec]:
    """arch: a timm model name; pretrained: true (timm's weights), a path to a state dict, or false;
    drop_rate: dropout before the classifier."""
    import timm  # heavy (timm imports its whole zoo, ~1 s): only timm models load it

    if not timm.is_model(arch):
        close = difflib.get_close_matches(arch.split(".")[0], timm.list_models(), n=5)
        raise UserError(f"model.args.arch: {arch!r} is not a timm model"
                        + (f"; similar: {', '.join(close)}" if close else "; see timm.list_models()"))
    kwargs = dict(num_classes=info.num_classes, in_chans=info.input_shape[0], drop_rate=drop_rate)
    if not pretrained or not materializing():
        return timm.create_model(arch, pretrained=False, **kwargs), input_spec(info)
    if pretrained is True:
        return _from_hub(timm, arch, kwargs), input_spec(info)
    path = local_path(str(pretrained), "model.args.pretrained")
    if not path.is_file():
        raise UserError(f"model.args.pretrained: {path} is not a file; point it at a state dict of {arch} "
                        "(.safetensors, or .pth/.bin), or use true for timm's own weights")
    try:
        model = timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kwargs)
        saved = set(timm.models.load_state_dict(str(path)))
    except Exception as e:  # noqa: BLE001 - unpickling, zip, safetensors and shape errors share no narrower base
        problem = weights_problem(e)
        if problem is not None:
            raise UserError(f"model.args.pretrained: {path} is {problem}; point it at a state dict of {arch}",
                            public=True) from None
        if not isinstance(e, (RuntimeError, ValueError, KeyError, OSError)):
            raise
        raise UserError(f"model.args.pretrained: {path} does not hold weights of {arch} "
                        f"({str(e).strip().splitlines()[0][:160]})") from None
    # timm loads what matches and only warns about the rest: a file of another architecture would leave
    # random weights behind without a word
    body = [k for k in model.state_dict() if not k.startswith(_head_prefixes(model))]
    found = sum(k in saved for k in body)
    if found < len(body) * MIN_MATCHED:
        raise UserError(f"model.args.pretrained: {path} does not hold weights of {arch} (only {found} of its "
                        f"{len(body)} tensors outside the classifier are in the file); point it at weights of {arch}")
    return model, input_spec(info)


MIN_MATCHED = 0.9  # of the tensors outside the classifier a weights file must have


def _head_prefixes(model: nn.Module) -> tuple[str, ...]:
    name = getattr(model, "pretrained_cfg", {}).get("classifier", "fc")
    names = name if isinstance(name, (list, tuple)) else [name]
    return tuple(f"{n}." for n in names)


def _from_hub(timm, arch: str, kwargs: dict) -> nn.Module:
    """timm's own weights of `arch`: from the Hugging Face cache without a word to the hub when they are there,
    else downloaded when the hub may be asked and answers; else one line saying how to fetch them."""
    cfg = timm.models.get_pretrained_cfg(arch)
    hub_id = getattr(cfg, "hf_hub_id", None) or None
    cached = cached_weights(hub_id) if hub_id else None
    if cached is not None:
        return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=cached), **kwargs)
    why = why_not_hub() if hub_id else ("HF_HUB_OFFLINE is set" if hub_offline() else None)
    if why is None:
        try:
            return timm.create_model(arch, pretrained=True, **kwargs)
        except (OSError, RuntimeError) as e:  # huggingface_hub's errors are OSErrors
            why = str(e).strip().splitlines()[0][:120] if str(e).strip() else type(e).__name__
    raise UserError(f"model.args.pretrained: timm's weights for {arch!r} are not in the Hugging Face cache and "
                    f"could not be fetched ({why}); on a machine with network run `hf download {hub_id or arch}` and "
                    "copy ~/.cache/huggingface here, or set model.args.pretrained to a weights file")


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm loads from a hub repo, in its order


def cached_weights(hub_id: str) -> Optional[str]:
    """The path of `hub_id`'s weights in the local Hugging Face cache (`repo@revision` as timm names them), or None."""
    from huggingface_hub import try_to_load_from_cache  # comes with timm; only pretrained timm models need it

    repo, _, revision = hub_id.partition("@")
    for name in WEIGHT_FILES:
        path = try_to_load_from_cache(repo, name, revision=revision or None)
        if isinstance(path, str) and os.path.isfile(path):
            return path
    return None
