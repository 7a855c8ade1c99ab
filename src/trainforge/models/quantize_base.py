"""`model.quantize_base: nf4 | int8 | none`: QLoRA, LoRA adapters on a quantized frozen base (torchao).

    model:
      name: hf
      args: {pretrained: Qwen/Qwen2.5-0.5B-Instruct}
      lora: {r: 8, alpha: 16, target_modules: all-linear}
      quantize_base: nf4

Valid only with `model.lora` (the config says so). `models.lora.apply_lora` loads the base in full precision,
takes its SHA-256 `base_reference` (so it still names the published weights), injects the adapters, and then
`quantize_base` replaces the weight of every frozen `nn.Linear` inside the transformer blocks (the numbered layers:
`...layers.3.self_attn.q_proj`, the base layer under a LoRA wrapper included) by a quantized tensor. Embeddings,
norms, the output head and the adapters keep their dtype; the adapters compute in the run's precision.

- nf4: torchao's `NF4Tensor` (the QLoRA paper's NormalFloat4, as torchtune uses it): blocks of 64 weights share an
  absmax scaler, and the scalers are quantized again to int8 in blocks of 256 (double quantization). `F.linear`
  on it dequantizes on the fly, in forward and backward (the input's gradient); the weight gets none.
- int8: torchao's int8 weight-only (`Int8WeightOnlyConfig`): per output channel symmetric int8 with a scale.

Quantizing rounds to nearest, deterministically, so a resumed run rebuilds the same base bit for bit. Checkpoints
never hold the base (they keep trainable weights only: `engine.checkpoint.kept_weights`). On the meta device or
under fake tensors (the planner) nothing is quantized; the planner counts `base_bytes_per_param(kind)` instead.
"""
from __future__ import annotations

import copy
import re
from typing import Any

import torch
from torch import nn

from trainforge.errors import UserError
from trainforge.models.base import materializing

FIELD = "model.quantize_base"
KINDS = ("nf4", "int8")
NF4_BLOCK = 64  # weights per absmax scaler (QLoRA, torchtune)
NF4_SCALER_BLOCK = 256  # scalers per int8 block of the double quantization
_NUMBERED = re.compile(r"(^|\.)\d+\.")  # a name inside a numbered list of blocks: model.layers.3.mlp.up_proj


def base_bytes_per_param(kind: str, *, dtype_bytes: float = 4.0, in_features: int = 4096) -> float:
    """Bytes a frozen base Linear weight takes per parameter once quantized, constants included (pure: the planner
    uses it). `dtype_bytes`: the base's own dtype (4 fp32, 2 bf16), in which the constants are kept; `in_features`:
    the row length int8 keeps one scale per. nf4: 4 bits + an int8 scaler per 64 + a factor per 64x256
    (~0.516 with fp32 constants), plus 17 values per tensor (mean, lookup table); int8: 1 byte + a scale and an
    int8 zero point per row (~1.001); none: `dtype_bytes`."""
    if kind == "nf4":
        return 0.5 + 1 / NF4_BLOCK + dtype_bytes / (NF4_BLOCK * NF4_SCALER_BLOCK)
    if kind == "int8":
        return 1.0 + (dtype_bytes + 1) / in_features
    if kind == "none":
        return float(dtype_bytes)
    raise ValueError(f"{FIELD}: expected one of nf4, int8, none, got {kind!r}")


def quantize_base(model: nn.Module, kind: str) -> list[str]:
    """Quantize, in place, the frozen Linear weights of `model`'s transformer blocks (after the adapters are in);
    the names of the quantized modules. Nothing happens for "none" or while not materializing (the planner)."""
    if kind == "none" or not materializing():
        return []
    if kind not in KINDS:
        raise UserError(f"{FIELD}: expected one of nf4, int8, none, got {kind!r}")
    quantize = _nf4_quantizer() if kind == "nf4" else _int8_quantizer()
    done = []
    for name, module in model.named_modules():
        if _quantizable(name, module, kind):
            quantize(module)
            done.append(name)
    return done


def _quantizable(name: str, module: nn.Module, kind: str) -> bool:
    if type(module) is not nn.Linear or module.weight.requires_grad or is_quantized(module.weight):
        return False
    if not _NUMBERED.search(name) or "lora_" in name or "modules_to_save" in name:
        return False  # outside the blocks (the output head, a classifier) or an adapter
    w = module.weight
    if w.dim() != 2 or not w.dtype.is_floating_point:
        return False
    return kind != "nf4" or w.numel() % NF4_BLOCK == 0  # an odd-sized layer keeps its precision


def _nf4_quantizer():
    to_nf4, _ = _nf4()

    def quantize(module: nn.Linear) -> None:
        w = module.weight.detach().contiguous()
        blocks = w.numel() // NF4_BLOCK
        # 256 scalers a block as torchtune does; a small layer (a tiny test model) groups its scalers by the largest
        # divisor of its block count instead, so any multiple of 64 weights quantizes
        scaler_block = max(d for d in range(1, min(NF4_SCALER_BLOCK, blocks) + 1) if blocks % d == 0)
        module.weight = nn.Parameter(to_nf4(w, NF4_BLOCK, scaler_block), requires_grad=False)

    return quantize


def _int8_quantizer():
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        raise _missing() from None
    config = Int8WeightOnlyConfig()

    def quantize(module: nn.Linear) -> None:
        quantize_(module, config)
        module.weight.requires_grad_(False)

    return quantize


def _nf4() -> tuple[Any, type]:
    """(to_nf4, NF4Tensor) from wherever this torchao keeps them (0.18 moved them out of torchao.dtypes)."""
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor, to_nf4
    except ImportError:
        try:
            from torchao.dtypes.nf4tensor import NF4Tensor, to_nf4
        except ImportError:
            raise _missing() from None
    return to_nf4, NF4Tensor


def _missing() -> UserError:
    return UserError(f"{FIELD}: quantizing the base needs torchao, which is not installed; pip install torchao "
                     f"(or set {FIELD}=none)", public=True)


def is_quantized(t: Any) -> bool:
    """A torchao quantized tensor (NF4Tensor, Int8Tensor, ...)."""
    return isinstance(t, torch.Tensor) and type(t).__module__.startswith("torchao.")


def dequantize(t: torch.Tensor) -> torch.Tensor:
    """A quantized weight back as a plain tensor of the dtype it was quantized from (other tensors as they are)."""
    if not is_quantized(t):
        return t
    if hasattr(t, "get_original_weight"):  # NF4Tensor (its `dequantize` is a static helper of another meaning)
        return t.get_original_weight()
    return t.dequantize()


def quantized_bytes(t: torch.Tensor) -> int:
    """Bytes `t` holds: a quantized tensor's inner tensors (data, scalers, constants), a plain one's elements."""
    if not is_quantized(t):
        return t.numel() * t.element_size()
    names, _ = t.__tensor_flatten__()
    return sum(quantized_bytes(getattr(t, n)) for n in names)


def dequantized_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` with every quantized weight replaced by its dequantized full-precision value (the
    original stays quantized): what merging adapters into the base starts from. Merging a QLoRA adapter into the
    dequantized base is what PEFT (`merge_and_unload` on a bitsandbytes 4-bit base) and torchtune do: the merged
    model is full precision (the base's dtype, bf16 or fp32), its base weights the NF4/int8 values the adapters
    were trained against, not the original ones."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        if is_quantized(p):
            memo[id(p)] = nn.Parameter(dequantize(p.detach()), requires_grad=False)
    return copy.deepcopy(module, memo)


def base_weight_bytes(model: nn.Module, only_quantized: bool = False) -> int:
    """Bytes of `model`'s frozen weights (quantized ones as they are stored); `only_quantized`: of those alone."""
    return sum(quantized_bytes(p) for p in model.parameters()
               if not p.requires_grad and (is_quantized(p) or not only_quantized))
