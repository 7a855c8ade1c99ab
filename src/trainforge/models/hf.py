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

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.confine import local_path
from trainforge.hub import check_weight_files, from_hub, load_weights_safely
from trainforge.models.base import InputSpec, materializing
from trainforge.models.quantize_base import dequantized_copy
from trainforge.models.zoo import DataFit, input_spec, register_model
from trainforge.layout import ADAPTER

FIELD = "model.args.pretrained"
NATIVE_FOLDER = "hf"  # final/hf/: save_pretrained, loadable by transformers in any other project
ADAPTER_FOLDER = ADAPTER  # final/adapter/: a LoRA run's adapters, loadable by PEFT



@dataclass(frozen=True)
class Head:
    """The transformers Auto class a task's model is built with, and what it is told of the data."""

    auto_class: str
    labels: bool = False  # told the data's classes (num_labels, id2label)
    pads: bool = False  # masks the data's padding id (text classification finds each sequence's last token by it)
    causal: bool = False  # next-token logits (token ids, or ids and restarting position ids stacked)
    detects: bool = False  # an object detector: wrapped in torchvision's detection convention (HFDetector)


# (task, input dtype, input dims or None for any) -> the head: the tasks the hf family serves
HEADS = {
    ("lm", "int64", None): Head("AutoModelForCausalLM", causal=True),
    ("classification", "int64", 1): Head("AutoModelForSequenceClassification", labels=True, pads=True),
    ("classification", "float32", 3): Head("AutoModelForImageClassification", labels=True),
    ("detection", "float32", 3): Head("AutoModelForObjectDetection", labels=True, detects=True),
}


def head_for(info: DataInfo) -> Optional[Head]:
    return HEADS.get((info.task, info.input_dtype, None)) or HEADS.get((info.task, info.input_dtype,
                                                                         len(info.input_shape)))


HF_DATA = DataFit(
    "text classification (int64 tokens), image classification or detection (float C,H,W) or language modelling",
    lambda info: head_for(info) is not None, tuple(sorted({task for task, _, _ in HEADS})),
)


class HFModel(nn.Module):
    """A transformers model behind the zoo's contract: x -> logits. Causal LMs take token ids (B, T), or ids and
    position ids stacked (B, 2, T) (chat data: packed examples restart their positions at 0, and transformers
    then keeps attention within each example)."""

    def __init__(self, model: nn.Module, *, pad_token_id: Optional[int], images: bool, causal: bool = False) -> None:
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id  # None: every position is attended (language modelling)
        self.images = images
        self.causal = causal
        self.base_reference: Optional[dict[str, Any]] = None  # set by models.lora: the frozen base adapters build on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.images:
            return self.model(pixel_values=x).logits
        if self.causal and x.dim() == 3:  # without a cache (with one, transformers ignores where positions restart)
            return self.model(input_ids=x[:, 0], position_ids=x[:, 1], use_cache=False).logits
        if self.causal:
            return self.model(input_ids=x).logits
        mask = None if self.pad_token_id is None else (x != self.pad_token_id).long()
        return self.model(input_ids=x, attention_mask=mask).logits

    def native_formats(self) -> dict[str, Callable[[Path], None]]:
        """final/<folder>/ -> its writer (training.artifacts): hf/ always (the whole model, adapters merged),
        adapter/ for a LoRA run (PEFT's own format)."""
        formats = {NATIVE_FOLDER: self.save_native}
        if self.base_reference is not None:
            formats[ADAPTER_FOLDER] = self.save_adapter
        return formats

    def save_native(self, directory: Path) -> None:
        """The model in transformers' own format (config.json + model.safetensors); a LoRA model merged into a copy
        of its base first, so it loads without PEFT; a quantized base (QLoRA) dequantized first, so the merged model
        is full precision (`quantize_base.dequantized_copy`)."""
        model = self.model
        if self.base_reference is not None:
            model = dequantized_copy(model).merge_and_unload()
        with no_progress_bars():
            model.save_pretrained(str(directory))

    def save_adapter(self, directory: Path) -> None:
        """The LoRA adapters as PEFT writes them: `PeftModel.from_pretrained(base, directory)` loads them."""
        self.model.save_pretrained(str(directory))


class HFDetector(nn.Module):
    """A transformers object detector (DETR, conditional DETR, RT-DETR ...) in torchvision's detection convention,
    which the detection task speaks (tasks/detection.py): training mode `model(images, targets)` -> {"loss": the
    model's own weighted sum of its matching losses}; eval mode `model(images)` -> per image {"boxes" xyxy in the
    input's pixels, "scores", "labels"}, by the model's image processor's `post_process_object_detection`.

    Images (B, 3, H, W) in [0, 1] (or a list of them, of several sizes under data.args.resize keep_aspect: padded
    with a pixel mask) are normalized here by the processor's mean and std (its resizing is the data's:
    data.args.image_size and resize); targets' xyxy pixel boxes become the normalized (cx, cy, w, h)
    transformers' detection losses take. The classes are the data's, background (0) included: the model never sees
    a box of class 0, and a query whose best class is 0 is not reported."""

    def __init__(self, model: nn.Module, processor: Any) -> None:
        super().__init__()
        self.model, self.processor = model, processor
        self.register_buffer("mean", torch.tensor(processor.image_mean, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(processor.image_std, dtype=torch.float32).view(1, -1, 1, 1),
                             persistent=False)

    def forward(self, images: Any, targets: Optional[list[dict[str, torch.Tensor]]] = None) -> Any:
        x, mask, sizes = self._batch(images)
        if self.training:
            if targets is None:
                raise ValueError("a detector in training mode takes the targets: model(images, targets)")
            from torchvision.ops import box_convert

            labels = [{"class_labels": t["labels"],
                       "boxes": box_convert(t["boxes"].float(), "xyxy", "cxcywh")
                       / torch.tensor([w, h, w, h], dtype=torch.float32, device=x.device)}
                      for t, (h, w) in zip(targets, sizes)]
            return {"loss": self.model(pixel_values=x, pixel_mask=mask, labels=labels).loss}
        out = self.model(pixel_values=x, pixel_mask=mask)
        found = self.processor.post_process_object_detection(out, threshold=0.0, target_sizes=sizes)
        return [{k: f[k][f["labels"] != 0] for k in ("boxes", "scores", "labels")} for f in found]

    def _batch(self, images: Any) -> tuple[torch.Tensor, Optional[torch.Tensor], list[tuple[int, int]]]:
        """Normalized pixel values, the pixel mask (None when every image is the batch's size) and each image's
        (height, width): images of several sizes (data.args.resize keep_aspect) are padded at the bottom and right
        after normalization, as transformers' processors pad, and the mask tells the model which pixels are real."""
        if not isinstance(images, (list, tuple)):
            return (images - self.mean) / self.std, None, [tuple(images.shape[-2:])] * len(images)
        sizes = [(int(i.shape[-2]), int(i.shape[-1])) for i in images]
        if len(set(sizes)) == 1:
            return (torch.stack(list(images)) - self.mean) / self.std, None, sizes
        height, width = max(h for h, _ in sizes), max(w for _, w in sizes)
        x = images[0].new_zeros((len(images), images[0].shape[0], height, width))
        mask = torch.zeros((len(images), height, width), dtype=torch.long, device=x.device)
        for k, (image, (h, w)) in enumerate(zip(images, sizes)):
            x[k, :, :h, :w] = (image - self.mean[0]) / self.std[0]
            mask[k, :h, :w] = 1
        return x, mask, sizes

    def native_formats(self) -> dict[str, Callable[[Path], None]]:
        return {NATIVE_FOLDER: self.save_native}

    def save_native(self, directory: Path) -> None:
        """The model and its image processor in transformers' own format: `AutoModelForObjectDetection` and
        `AutoImageProcessor.from_pretrained(directory)` load them."""
        with no_progress_bars():
            self.model.save_pretrained(str(directory))
        self.processor.save_pretrained(str(directory))


def image_processor(hf_config: Any, source: Optional[str], trust_remote_code: bool) -> Any:
    """The model's image processor: the pretrained model's own (its preprocessor_config.json), else the default one
    of its model type (a model built from a config alone)."""
    from transformers import AutoImageProcessor
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    if source is not None:
        return from_hub(AutoImageProcessor.from_pretrained, source, "image processor", field=FIELD,
                        trust_remote_code=trust_remote_code)
    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(hf_config.model_type)
    if not names:
        raise UserError(f"model.args.config: transformers has no image processor for model_type "
                        f"{hf_config.model_type!r}; name a pretrained detector in model.args.pretrained")
    import transformers

    name = names.get("torchvision") or names.get("pil") if isinstance(names, dict) else \
        next(n for n in names if n is not None)
    return getattr(transformers, name)()


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """Without transformers' "Loading weights" and "Writing model shards" bars: the run's own console says what
    it loads and writes, and a bar per tensor file is noise in logs."""
    from transformers.utils import logging as hf_logging  # loaded already: an hf model is being built or saved

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def quiet_load(load: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`load(...)` without transformers' multi-line load report (missing, unexpected and resized tensors): which of
    them matter is said by `_check_weights_fit`, in one line, and a new head's fresh weights are the expected case."""
    from transformers.utils import logging as hf_logging  # loaded already: an hf model is being built

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return load(*args, **kwargs)
    finally:
        hf_logging.set_verbosity(level)


@register_model("hf", fits=HF_DATA)
def hf(info: DataInfo, pretrained: Union[str, bool] = False, config: Union[str, dict, None] = None,
       pad_token_id: Optional[int] = None, trust_remote_code: bool = False) -> tuple[nn.Module, InputSpec]:
    """pretrained: a hub id or a local directory, or false (true with `config` an id or a directory: that model's
    weights); config (with pretrained false): an id, a directory or an inline dict with `model_type`; pad_token_id: the padding id of text-classification inputs (default:
    the data's, else the model's, else 0); trust_remote_code: let a model whose classes are its own code (auto_map)
    run that code (off: such a model is one line saying so; on: one warning naming the files)."""
    if not isinstance(trust_remote_code, bool):
        raise UserError("model.args.trust_remote_code: true or false")
    import transformers  # heavy (~3 s): only hf models load it
    from transformers import AutoConfig

    if pretrained is True and isinstance(config, str):  # the weights of the model `config` names (a recipe's default)
        pretrained, config = config, None
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
    head_of_task = head_for(info)
    auto = getattr(transformers, head_of_task.auto_class)
    head: dict[str, Any] = {}
    if head_of_task.labels:
        names = list(info.class_names) or [str(i) for i in range(info.num_classes)]
        head = dict(num_labels=info.num_classes, id2label=dict(enumerate(names)),
                    label2id={n: i for i, n in enumerate(names)})

    source = str(pretrained) if pretrained else None
    trust = trust_remote_code
    if source is not None and Path(source).expanduser().is_dir():  # a folder someone made: its weights checked first
        check_weight_files(local_path(source, FIELD), FIELD)
    hf_config = (_config(config, AutoConfig, trust) if source is None
                 else from_hub(AutoConfig.from_pretrained, source, "config", field=FIELD, trust_remote_code=trust))
    for key, value in head.items():
        setattr(hf_config, key, value)
    # the data's padding id (its tokenizer's) wins over the model config's: the model must mask what the data pads
    pad = next((p for p in (pad_token_id, info.pad_id, getattr(hf_config, "pad_token_id", None)) if p is not None),
               None)
    if head_of_task.pads:
        pad = 0 if pad is None else pad
        hf_config.pad_token_id = pad  # sequence classifiers find each sequence's last token by it
    if source is None and info.vocab_size and getattr(hf_config, "vocab_size", None) is None:
        hf_config.vocab_size = info.vocab_size
    _check_vocab(hf_config, info)
    _check_positions(hf_config, info)
    if source is None or not materializing():
        model = auto.from_config(hf_config, trust_remote_code=trust)
    else:
        with no_progress_bars():
            model, loading = load_weights_safely(lambda: quiet_load(from_hub,
                auto.from_pretrained, source, "weights", field=FIELD, config=hf_config, ignore_mismatched_sizes=True,
                trust_remote_code=trust, output_loading_info=True), source, FIELD)
            _check_weights_fit(model, loading, source)
    if head_of_task.detects:
        return HFDetector(model, image_processor(hf_config, source, trust)), input_spec(info)
    return (HFModel(model, pad_token_id=pad if head_of_task.pads else None, images=images,
                    causal=head_of_task.causal), input_spec(info))


def _config(config: Union[str, dict], auto_config, trust_remote_code: bool) -> Any:
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
    return from_hub(auto_config.from_pretrained, str(config), "config", field="model.args.config",
                    trust_remote_code=trust_remote_code)


HEAD_WORDS = ("classifier", "score", "lm_head", "pooler", "head")  # what a new task replaces: fresh weights expected
MIN_BODY_LOADED = 0.9  # of the tensors outside the head that the weights file must fill


def _check_weights_fit(model: nn.Module, loading: dict[str, Any], source: str) -> None:
    """transformers fills what its weights file lacks, or holds at another shape, with random values and only warns:
    weights of another model would train from scratch without a word. Outside the head, at least MIN_BODY_LOADED
    of the tensors must have come from the file."""
    body = [k for k in model.state_dict() if not any(w in k for w in HEAD_WORDS)]
    unfilled = set(loading.get("missing_keys") or ()) | {m[0] if isinstance(m, (tuple, list)) else m
                                                        for m in loading.get("mismatched_keys") or ()}
    lacking = [k for k in body if k in unfilled]
    if body and len(lacking) > (1 - MIN_BODY_LOADED) * len(body):
        raise UserError(f"{FIELD}: {source}'s weights do not fit its config ({len(lacking)} of {len(body)} tensors "
                        f"outside the head missing or of another shape, e.g. {lacking[0]}); the folder's config.json "
                        "and weights are of different models", public=True)


# where transformers configs state how many positions the model embeds (GPT-2's n_positions, most others'
# max_position_embeddings; n_ctx in older GPT-style configs)
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "n_ctx")


def _check_positions(hf_config: Any, info: DataInfo) -> None:
    """Token samples longer than the positions the model embeds fail at their first forward ("index out of range"):
    said here, in the pre-flight, in one line naming both numbers."""
    if info.input_dtype != "int64" or not info.seq_len:
        return
    for name in POSITION_LIMITS:
        limit = getattr(hf_config, name, None)
        if isinstance(limit, int) and limit > 0:
            if info.seq_len > limit:
                raise UserError(f"data.args: samples of {info.seq_len} tokens are longer than the model's {limit} "
                                f"positions ({name} in its config); set the data's length (data.args.seq_len, or "
                                f"block_size for plain text) to {limit} or less", public=True)
            return


def _check_vocab(hf_config: Any, info: DataInfo) -> None:
    vocab = getattr(hf_config, "vocab_size", None)
    if info.input_dtype == "int64" and info.vocab_size and vocab is not None and vocab < info.vocab_size:
        raise UserError(f"model.args: the model's vocabulary ({vocab} tokens) is smaller than the data's "
                        f"({info.vocab_size}); raise vocab_size in model.args.config or tokenize for this model")
