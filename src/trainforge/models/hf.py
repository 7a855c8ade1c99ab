"""`model.name: hf`: a Hugging Face `transformers` model, from pretrained weights or from a config alone.

    model:
      name: hf
      args:
        pretrained: distilbert-base-uncased      # a hub id or a local directory (save_pretrained)
    model:
      name: hf
      args:
        pretrained: false                        # random weights: training from scratch, or planning a model
        config: {model_type: llama, hidden_size: 4096, num_hidden_layers: 32, ...}   # or an id or a directory

The head follows the data: text classification -> AutoModelForSequenceClassification, image classification
-> AutoModelForImageClassification (both with `num_labels` and the label names of the data; a pretrained head
of another size is replaced by a new one), `task: lm` -> AutoModelForCausalLM.

Loading is offline-first: a local directory, else the local Hugging Face cache, else the hub when it can be
reached (never with `HF_HUB_OFFLINE=1`). A model found in none of them is one line naming the id and how to
fetch it. Built on the meta device or under fake tensors (the planner, the launcher's checks), a pretrained
model is built from its config alone: no weights are read.

The module follows the zoo's contract: token ids (B, T) or images (B, C, H, W) in, logits out. For text
classification the attention mask marks the padding id (the data's: 0 for the byte tokenizer) as absent.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models.base import InputSpec, materializing
from trainforge.models.zoo import DataFit, input_spec, register_model

NATIVE_FOLDER = "hf"  # final/hf/: save_pretrained, loadable by transformers in any other project

HF_DATA = DataFit(
    "text classification (int64 tokens), image classification (float C,H,W) or language modelling",
    lambda info: (info.task == "lm" and info.input_dtype == "int64")
    or (info.task == "classification" and info.input_dtype == "int64" and len(info.input_shape) == 1)
    or (info.task == "classification" and info.input_dtype == "float32" and len(info.input_shape) == 3),
)


class HFModel(nn.Module):
    """A transformers model behind the zoo's contract: x -> logits."""

    native_folder = NATIVE_FOLDER  # final/<native_folder>/ gets `save_native` (training.artifacts)

    def __init__(self, model: nn.Module, *, pad_token_id: Optional[int], images: bool) -> None:
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id  # None: every position is attended (language modelling)
        self.images = images

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.images:
            return self.model(pixel_values=x).logits
        mask = None if self.pad_token_id is None else (x != self.pad_token_id).long()
        return self.model(input_ids=x, attention_mask=mask).logits

    def save_native(self, directory: Path) -> None:
        """The model in transformers' own format (config.json + model.safetensors)."""
        self.model.save_pretrained(str(directory))


@register_model("hf", fits=HF_DATA)
def hf(info: DataInfo, pretrained: Union[str, bool] = False, config: Union[str, dict, None] = None,
       pad_token_id: Optional[int] = None) -> tuple[nn.Module, InputSpec]:
    """pretrained: a hub id or a local directory, or false; config (with pretrained false): an id, a directory
    or an inline dict with `model_type`; pad_token_id: the padding id of text-classification inputs (default:
    the model's, else 0, the byte tokenizer's)."""
    # heavy (transformers, ~3 s): only hf models load it
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForImageClassification,
                              AutoModelForSequenceClassification)

    if pretrained is True:
        raise UserError("model.args.pretrained: name the weights (a hub id or a local directory), or false with "
                        "model.args.config for random weights")
    if pretrained and config is not None:
        raise UserError("model.args.config: used only with model.args.pretrained: false (the pretrained model "
                        "brings its own config); remove one of them")
    if not pretrained and config is None:
        raise UserError("model.args.config: required with model.args.pretrained: false (a hub id, a directory or "
                        "{model_type: ..., ...}); or name pretrained weights in model.args.pretrained")
    images = info.input_dtype == "float32"
    auto = AutoModelForCausalLM if info.task == "lm" else (
        AutoModelForImageClassification if images else AutoModelForSequenceClassification)
    head: dict[str, Any] = {}
    if info.task == "classification":
        names = list(info.class_names) or [str(i) for i in range(info.num_classes)]
        head = dict(num_labels=info.num_classes, id2label=dict(enumerate(names)),
                    label2id={n: i for i, n in enumerate(names)})

    source = str(pretrained) if pretrained else None
    hf_config = _config(config, AutoConfig) if source is None else _load(AutoConfig.from_pretrained, source, "config")
    for key, value in head.items():
        setattr(hf_config, key, value)
    pad = pad_token_id if pad_token_id is not None else getattr(hf_config, "pad_token_id", None)
    if info.task == "classification" and not images:
        pad = 0 if pad is None else pad
        hf_config.pad_token_id = pad  # sequence classifiers find each sequence's last token by it
    if source is None and info.vocab_size and getattr(hf_config, "vocab_size", None) is None:
        hf_config.vocab_size = info.vocab_size
    _check_vocab(hf_config, info)
    if source is None or not materializing():
        model = auto.from_config(hf_config)
    else:
        model = _load(auto.from_pretrained, source, "weights", config=hf_config, ignore_mismatched_sizes=True)
    return HFModel(model, pad_token_id=None if info.task == "lm" or images else pad, images=images), input_spec(info)


def _config(config: Union[str, dict], auto_config) -> Any:
    if isinstance(config, dict):
        settings = dict(config)
        model_type = settings.pop("model_type", None)
        if not isinstance(model_type, str):
            raise UserError("model.args.config: an inline config needs model_type (e.g. bert, llama, gpt2, vit)")
        try:
            return auto_config.for_model(model_type, **settings)
        except (ValueError, KeyError) as e:
            raise UserError(f"model.args.config.model_type: {model_type!r} is not a transformers model type "
                            f"({str(e).splitlines()[0][:120]})") from None
    return _load(auto_config.from_pretrained, str(config), "config")


def _load(loader, source: str, what: str, **kwargs: Any) -> Any:
    """`loader(source)` from a local directory or the cache first, the hub only when allowed and needed."""
    local = Path(source).expanduser()
    if local.is_dir():
        try:
            return loader(str(local), local_files_only=True, **kwargs)
        except (OSError, ValueError) as e:
            raise UserError(f"model.args.pretrained: {local} is not a transformers model directory "
                            f"({_first_line(e)}); write one with save_pretrained") from None
    try:
        return loader(source, local_files_only=True, **kwargs)
    except OSError:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("", "0", "false"):
        raise UserError(_not_found(source, what, "HF_HUB_OFFLINE is set, so the hub was not asked"))
    try:
        return loader(source, **kwargs)
    except OSError as e:
        raise UserError(_not_found(source, what, _first_line(e))) from None


def _not_found(source: str, what: str, why: str) -> str:
    return (f"model.args.pretrained: {source!r} is neither a local directory nor in the Hugging Face cache, and its "
            f"{what} could not be fetched ({why}); on a machine with network run `hf download {source}` (the cache "
            "is ~/.cache/huggingface, or $HF_HOME) and copy it here, or point model.args.pretrained at a local "
            "directory")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def _check_vocab(hf_config: Any, info: DataInfo) -> None:
    vocab = getattr(hf_config, "vocab_size", None)
    if info.input_dtype == "int64" and info.vocab_size and vocab is not None and vocab < info.vocab_size:
        raise UserError(f"model.args: the model's vocabulary ({vocab} tokens) is smaller than the data's "
                        f"({info.vocab_size}); raise vocab_size in model.args.config or tokenize for this model")
