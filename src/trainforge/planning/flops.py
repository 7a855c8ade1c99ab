"""FLOPs of one training step: counted by running it (`count_flops`) or by formula.

    with FakeTensorMode():                      # no real memory, any model size
        model, spec = build_fake_model(cfg.model, info)     # planning.fake_model
        batch = task_of(info).example_batch(info, spec.example(8), 8)
        model_flops, hardware_flops = count_flops(model, batch, task=task_of(info), precision="bf16")
    model_flops, hardware_flops = step_flops_per_sample(cfg.model, info, precision="bf16")  # per sample (simulate)

*Model* FLOPs are what the maths of forward + backward needs (what MFU divides by); *hardware*
FLOPs add what the machine really runs on top, i.e. the forward of activation-checkpointed blocks
recomputed in backward (HFU). Only matmuls, convolutions and attention are counted, as in
`torch.utils.flop_counter`: elementwise ops, norms and the optimizer step are a rounding error
in FLOPs (they matter for memory traffic, which the roofline handles separately).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Union

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from trainforge.engine.parallelize import observe_recompute
from trainforge.tasks import TASKS, Task, task_of
from trainforge.tasks.batch import batch_device
from trainforge.engine.precision import autocast

aten = torch.ops.aten


def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    # 4*b*s^2*h for QK^T and AV together: the same formula torch uses for the GPU kernels
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    # backward = 2x forward (gradients w.r.t. both operands of both matmuls), as in PaLM appendix B;
    # the score recompute of flash kernels is left out so attention model FLOPs match 12*L*H*Q*T
    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


# torch 2.14's counter has formulas for the CUDA attention kernels only; on the CPU SDPA dispatches
# to the ops below and would count 0. Registering them per op (rather than adding a per-layer
# term afterwards) cannot double count: the math fallback (masks, dropout) decomposes into
# bmm, which the counter already counts, and never calls these ops.
ATTENTION_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flop,
}


def count_flops(model: nn.Module, batch: Any, *, task: Union[Task, str], precision: str) -> tuple[float, float]:
    """(model_flops, hardware_flops) of forward + loss + backward on `batch` (the task's example batch).

    Runs the step under `FlopCounterMode`; works on fake tensors. Leaves `.grad` unset afterwards.
    With activation checkpointing applied (`trainforge.engine.parallelize`), hardware FLOPs
    include what backward recomputes (not always the whole forward of a block: torch stops a
    recompute once every saved tensor is back); model FLOPs do not.
    """
    task = TASKS.get(task) if isinstance(task, str) else task
    device = batch_device(batch)
    recompute_flops: list[int] = []

    @contextlib.contextmanager
    def count_recompute() -> Iterator[None]:
        # nested under `counter`, which keeps counting the same ops as hardware FLOPs
        inner = _counter()
        try:
            with inner:
                yield
        finally:  # torch ends a recompute early by raising through this context
            recompute_flops.append(inner.get_total_flops())

    counter = _counter()
    with counter, observe_recompute(count_recompute):
        with autocast(device, precision):
            output = task.forward(model, batch)
        task.training_loss(output, batch).backward()  # the targets' values do not change the FLOPs
    for p in model.parameters():
        p.grad = None
    hardware_flops = float(counter.get_total_flops())
    return hardware_flops - sum(recompute_flops), hardware_flops


def _counter() -> FlopCounterMode:
    return FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS)


def transformer_flops_per_token(
    n_params_non_embedding: int, n_layer: int, n_head: int, head_dim: int, seq_len: int
) -> float:
    """Training (forward + backward) FLOPs per token of a decoder transformer: 6N + 12*L*H*Q*T.

    Chowdhery et al. 2022 (PaLM), appendix B: 6N for the weight matmuls (2N forward, 4N backward)
    plus 12*L*H*Q*T for attention scores and values, with N the non-embedding parameters, L layers,
    H heads of size Q and sequence length T. No recompute, no causal-mask savings. A separate
    output projection (or one tied to the input embedding) costs 6*vocab*width more per token:
    include its weights in N when it is not negligible (GPT-2 small: ~27% of the total).
    """
    return 6.0 * n_params_non_embedding + 12.0 * n_layer * n_head * head_dim * seq_len
