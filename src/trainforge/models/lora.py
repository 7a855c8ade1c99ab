"""`model.lora`: LoRA adapters on a pretrained transformers model, with PEFT; every base weight frozen.

    model:
      name: hf
      args: {pretrained: Qwen/Qwen2.5-0.5B-Instruct}
      lora: {r: 8, alpha: 16, dropout: 0.05, target_modules: [q_proj, v_proj]}   # or all-linear

`zoo.build_model` applies it after the family has built the model. PEFT is what the ecosystem loads
adapters with (`PeftModel.from_pretrained(base, "runs/.../final/adapter")`), so trainforge uses its layers
rather than its own. A run of adapters refers to its base by `base_reference`: the source and the SHA-256 of
the base weights as loaded, so a checkpoint that holds only adapters is resumed or evaluated on exactly the
weights it was trained on.
"""
from __future__ import annotations

import hashlib
import warnings
from typing import Any, Optional

import torch
from torch import nn

from trainforge.config import LoraConfig
from trainforge.errors import UserError
from trainforge.models.base import materializing
from trainforge.models.quantize_base import quantize_base

FIELD = "model.lora"


def apply_lora(model: nn.Module, cfg: LoraConfig, source: Optional[str], quantize: str = "none") -> nn.Module:
    """`model` (an HFModel) with LoRA adapters on `cfg.target_modules`, in place; only adapters (and a new
    classification head) train. `source`: the base's hub id or folder, recorded in `base_reference` (the weights
    as loaded, before `quantize`: model.quantize_base, QLoRA, quantizes the frozen base once the adapters are in)."""
    from peft import LoraConfig as PeftLoraConfig  # heavy (peft imports transformers' trainer parts): LoRA runs only
    from peft import get_peft_model

    inner = getattr(model, "model", None)
    if not hasattr(inner, "config") or not hasattr(inner, "save_pretrained"):
        raise UserError(f"{FIELD}: LoRA adapters go on a transformers model (model.name: hf); "
                        "remove model.lora or use model.name hf", public=True)
    digest = weights_sha256(inner) if materializing() else None
    task, head = peft_task(model)
    peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                              target_modules=cfg.target_modules, task_type=task, modules_to_save=head)
    try:
        with warnings.catch_warnings():  # PEFT asks transformers a deprecated question; not the user's to fix
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
            model.model = get_peft_model(inner, peft_cfg)
    except ValueError as e:  # PEFT: "Target modules {...} not found in the base model"
        names = sorted({name.rsplit(".", 1)[-1] for name, m in inner.named_modules() if isinstance(m, nn.Linear)})
        raise UserError(f"{FIELD}.target_modules: {cfg.target_modules!r} names no Linear layer of this model "
                        f"({str(e).splitlines()[0][:120]}); its Linear layers are named: {', '.join(names)}; or use "
                        "all-linear", public=True) from None
    model.base_reference = {"source": source, "sha256": digest}
    quantize_base(model.model, quantize)
    return model


def peft_task(model: nn.Module) -> tuple[Optional[str], Optional[list[str]]]:
    """PEFT's task type, and the modules trained whole beside the adapters: a classifier's new head."""
    if getattr(model, "causal", False):
        return "CAUSAL_LM", None
    if getattr(model, "images", False):  # PEFT has no task type for image classifiers: name the head
        head = [name for name in ("classifier", "head", "fc") if hasattr(model.model, name)]
        return None, head[:1] or None
    return "SEQ_CLS", None  # PEFT trains the sequence classifier's head (classifier / score) in full


def weights_sha256(module: nn.Module) -> str:
    """SHA-256 over every parameter and persistent buffer (name, dtype, shape, bytes) in name order."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def base_reference(model: nn.Module) -> Optional[dict[str, Any]]:
    """{"source", "sha256"} of a model with LoRA adapters, else None (the model's weights are all its own)."""
    return getattr(model, "base_reference", None)


def adapter_names(model: nn.Module) -> Optional[set[str]]:
    """The state-dict names a checkpoint of `model` keeps: its trainable parameters (adapters, a new head) when
    it has a frozen base it refers to, else None (every weight)."""
    if base_reference(model) is None:
        return None
    return {state_dict_name(name) for name, p in model.named_parameters() if p.requires_grad}


WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.")  # activation checkpointing, compile


def state_dict_name(name: str) -> str:
    """A parameter's name as state_dict() gives it: the wrappers of activation checkpointing and compile leave
    their part in named_parameters() but take it out of state dicts."""
    for part in WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def check_base(saved: Optional[dict[str, Any]], model: nn.Module, where: str) -> None:
    """A checkpoint of adapters continues only on the base it was trained on."""
    own = base_reference(model)
    if not saved or own is None or not saved.get("sha256") or not own.get("sha256"):
        return
    if saved["sha256"] != own["sha256"]:
        raise UserError(f"{where}: its LoRA adapters were trained on base weights {saved['sha256'][:12]}... "
                        f"({saved.get('source')}), but {own.get('source')} now gives {own['sha256'][:12]}...; point "
                        "model.args.pretrained at the base it was trained on", public=True)
