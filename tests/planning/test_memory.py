"""Peak memory against the micro-batch: convex, not a line; the lines of `fit_linear` are lower bounds, and the
planner confirms the micro-batch it takes with a simulation. The trackers keep torch's global peak."""
from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from trainforge.config import ModelConfig, OptimConfig
from trainforge.data.base import DataInfo
from trainforge.models import build_model
from trainforge.planning.memory import LinearPeak, SimCache, SimKey, fit_linear
from trainforge.planning.plan import MemoryRule, ModelFacts, fit_memory
from trainforge.planning.simulate import simulate_step
from trainforge.planning.trackers import PeakMemTracker
from trainforge.engine.losses import task_loss
from trainforge.engine.optim import build_optimizer

ADAMW = OptimConfig(name="adamw", weight_decay=0.1)
VOCAB_4K = DataInfo("lm", "text", (64,), "int64", 4096, vocab_size=4096, seq_len=64)
TINY_GPT = ModelConfig(name="gpt", args=dict(n_layer=2, n_head=4, n_embd=128))
PLAIN = SimKey("none", 1, False, "fp32")


def cache_for(model_cfg: ModelConfig, info: DataInfo) -> SimCache:
    return SimCache(lambda key, b: simulate_step(model_cfg, ADAMW, info, micro_batch_size=b,
                                                 activation_checkpointing=key.activation_checkpointing))


def total_line(one, two) -> LinearPeak:
    """The line through the two total peaks: what the planner used before phases and confirmation."""
    per_sample = (two.peak_bytes - one.peak_bytes) / (two.micro_batch_size - one.micro_batch_size)
    return LinearPeak(one.peak_bytes - per_sample * one.micro_batch_size, per_sample)


def test_the_peak_is_convex_in_the_micro_batch_and_the_plan_takes_a_size_whose_simulation_fits():
    cache = cache_for(TINY_GPT, VOCAB_4K)
    one, two, big = (cache.get(PLAIN, b) for b in (1, 2, 32))
    # micro-batch 1 peaks in backward (gradients and state, few activations), larger ones at the end of forward:
    # 1.7 MB from 1 to 2, then 5.3 MB per sample
    assert cache.get(PLAIN, 3).peak_bytes - two.peak_bytes > 3 * (two.peak_bytes - one.peak_bytes)
    line = fit_linear(one, two)
    assert line.at(32) < 0.45 * big.peak_bytes  # a line through 1 and 2 is a lower bound, far below
    assert total_line(one, two).at(32) <= line.at(32)
    # with 100 MB the line says 32 fits (72 MB) but it needs 181 MB: the plan takes 16, which does fit
    facts = ModelFacts("transformer", False, one.param_count, 16)
    fit = fit_memory(1, 64, cache, facts, MemoryRule(100e6, (), None), "fp32")
    assert fit.micro_batch_size == 16 and fit.simulated_peak_bytes == cache.get(PLAIN, 16).peak_bytes <= 100e6
    assert cache.get(PLAIN, 32).peak_bytes > 100e6 and fit.sim is cache.get(PLAIN, 16)


def test_phase_lines_hold_when_the_optimizer_step_holds_the_peak_at_micro_batch_1():
    info = DataInfo("lm", "text", (128,), "int64", 4096, vocab_size=4096, seq_len=128)
    llama = ModelConfig(name="hf", args=dict(pretrained=False, config=dict(
        model_type="llama", hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=4096)))
    cache = cache_for(llama, info)
    key = SimKey("none", 1, True, "fp32")  # activation checkpointing: few activations, all of the state
    one, two, four = (cache.get(key, b) for b in (1, 2, 4))
    assert one.peak_bytes == one.phase_peak_bytes["optimizer_step"] > one.phase_peak_bytes["forward_backward"]
    assert two.peak_bytes == two.phase_peak_bytes["forward_backward"]
    assert fit_linear(one, two).at(4) == four.peak_bytes  # each phase is a line here
    assert total_line(one, two).at(4) < 0.96 * four.peak_bytes  # one line through both is 5% short at 4


def test_peak_mem_tracker_keeps_torchs_global_peak_and_breakdown():
    def tracked_step(tracker_type) -> dict:
        torch.manual_seed(0)
        model, spec = build_model(TINY_GPT, VOCAB_4K)
        optimizer = build_optimizer(model, ADAMW)
        x = spec.example(4)
        tracker = tracker_type()
        tracker.track_external(model, optimizer, x)
        with tracker:
            task_loss(model(x), torch.zeros((4, 64), dtype=torch.long), "lm").backward()
            optimizer.step()
        return tracker.get_tracker_snapshot("peak")

    assert tracked_step(PeakMemTracker) == tracked_step(MemTracker)
