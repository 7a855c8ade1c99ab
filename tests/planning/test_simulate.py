"""The simulated training step: fake-tensor peaks against real CPU runs, FSDP sharding, no real memory."""
from __future__ import annotations

import resource
import time

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from trainforge.config import ModelConfig, OptimConfig
from trainforge.data.base import DataInfo
from trainforge.engine.parallelize import apply_activation_checkpointing, find_blocks
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.planning.fake_model import build_fake_model
from trainforge.planning.simulate import BREAKDOWN_KEYS, Simulation, measure_real_step, simulate_step

DIGITS = DataInfo("classification", "image", (1, 8, 8), "float32", 10, tuple("0123456789"))
CNN = ModelConfig(name="cnn", args=dict(channels=[32, 64, 128]))
TEXT = DataInfo("lm", "text", (128,), "int64", 256, vocab_size=256, seq_len=128)
SMALL_GPT = ModelConfig(name="gpt", args=dict(n_layer=2, n_head=4, n_embd=128))
ADAMW = OptimConfig(name="adamw", weight_decay=0.1)


def check_breakdown(sim: Simulation) -> None:
    assert set(BREAKDOWN_KEYS) <= set(sim.breakdown) <= set(BREAKDOWN_KEYS) | {"other"}
    assert sum(sim.breakdown.values()) == sim.peak_bytes


# ---------------------------------------------------------------- simulated against real


@pytest.mark.parametrize(
    "model_cfg, info, batch, kwargs",
    [
        pytest.param(CNN, DIGITS, 64, {}, id="digits-cnn-fp32"),
        pytest.param(SMALL_GPT, TEXT, 8, {}, id="small-gpt-fp32"),
        pytest.param(SMALL_GPT, TEXT, 8, dict(precision="bf16", activation_checkpointing=True), id="small-gpt-bf16-ac"),
        pytest.param(SMALL_GPT, TEXT, 8, dict(precision="bf16", strategy="fsdp", world_size=2), id="small-gpt-fsdp2"),
    ],
)
def test_simulated_peak_matches_a_real_cpu_step(model_cfg, info, batch, kwargs):
    sim = simulate_step(model_cfg, ADAMW, info, micro_batch_size=batch, **kwargs)
    real = measure_real_step(model_cfg, ADAMW, info, micro_batch_size=batch, **kwargs)
    assert sim.peak_bytes == pytest.approx(real, rel=0.05)
    check_breakdown(sim)
    assert sim.breakdown["optimizer_state"] >= 2 * sim.param_bytes  # AdamW: two moments per weight


MLP = ModelConfig(name="mlp", args=dict(hidden=[512, 512]))


@pytest.mark.parametrize(
    "model_cfg, info, batch, kwargs",
    [
        pytest.param(SMALL_GPT, TEXT, 8, {}, id="forward-backward-peak"),
        pytest.param(MLP, DIGITS, 1, {}, id="optimizer-step-peak"),
        pytest.param(MLP, DIGITS, 1, dict(strategy="fsdp", world_size=2), id="fsdp2-first-step-fills-dtensor-cache"),
        pytest.param(SMALL_GPT, TEXT, 2, dict(precision="bf16", activation_checkpointing=True), id="small-gpt-bf16-ac"),
    ],
)
def test_one_forward_backward_gives_exactly_the_peak_of_two_real_iterations(model_cfg, info, batch, kwargs):
    # the simulation runs forward + backward once and adds the state for the second (simulate._replayed_iterations);
    # the real step runs both iterations
    sim = simulate_step(model_cfg, ADAMW, info, micro_batch_size=batch, **kwargs)
    assert sim.peak_bytes == measure_real_step(model_cfg, ADAMW, info, micro_batch_size=batch, **kwargs)
    assert sim.peak_bytes == max(sim.phase_peak_bytes.values())


def test_activation_checkpointing_trades_activations_for_recompute():
    plain = simulate_step(SMALL_GPT, ADAMW, TEXT, micro_batch_size=8)
    ac = simulate_step(SMALL_GPT, ADAMW, TEXT, micro_batch_size=8, activation_checkpointing=True)
    assert ac.activation_bytes < 0.6 * plain.activation_bytes
    assert ac.peak_bytes < plain.peak_bytes
    assert ac.model_flops_per_sample == plain.model_flops_per_sample
    assert ac.hardware_flops_per_sample > plain.hardware_flops_per_sample


def test_simulation_reports_model_facts():
    sim = simulate_step(SMALL_GPT, ADAMW, TEXT, micro_batch_size=8, precision="bf16")
    model, _ = build_model(SMALL_GPT, TEXT)
    n = sum(p.numel() for p in model.parameters())
    assert (sim.param_count, sim.param_bytes, sim.grad_bytes) == (n, 4 * n, 4 * n)  # fp32 master weights
    assert sim.tokens_per_sample == 128
    assert sim.model_flops_per_sample == pytest.approx(6 * n * 128, rel=0.2)
    assert sim.memory_traffic_bytes_per_sample > 3 * sim.activation_bytes / 8  # activations alone, read back
    assert sim.optimizer_state_bytes >= 2 * sim.param_bytes
    assert simulate_step(CNN, ADAMW, DIGITS, micro_batch_size=4).tokens_per_sample == 1


def test_ddp_is_one_replica_per_rank_with_a_note():
    none = simulate_step(SMALL_GPT, ADAMW, TEXT, micro_batch_size=4)
    ddp = simulate_step(SMALL_GPT, ADAMW, TEXT, micro_batch_size=4, strategy="ddp", world_size=4)
    assert ddp.peak_bytes == none.peak_bytes
    assert any("bucket" in note for note in ddp.notes) and not none.notes


def test_simulating_twice_gives_the_same_numbers():
    for kwargs in ({}, dict(strategy="fsdp", world_size=4, precision="bf16")):
        first = simulate_step(SMALL_GPT, ADAMW, TEXT, micro_batch_size=4, **kwargs)
        assert simulate_step(SMALL_GPT, ADAMW, TEXT, micro_batch_size=4, **kwargs) == first
    assert not dist.is_initialized()  # the fake process group is torn down


# ---------------------------------------------------------------- no real memory


def test_the_fake_model_is_built_on_meta_and_keeps_tied_weights_tied():
    with FakeTensorMode():
        model, spec = build_fake_model(SMALL_GPT, TEXT)
        assert model.lm_head.weight is model.transformer.wte.weight  # one tensor, as built
        tensors = [*model.parameters(), *model.buffers()]
        assert all(isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tensors)
        model(spec.example(2)).sum().backward()
    real, _ = build_model(SMALL_GPT, TEXT)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in real.parameters())


# the timing bars of this file are in CPU seconds: simulation runs fake tensors on one thread, so on a machine to
# itself that is its wall time, and beside other tests (the suite's parallel phase) their cores do not count
def test_gpt2_small_simulates_without_allocating_its_memory():
    info = DataInfo("lm", "text", (1024,), "int64", 50257, vocab_size=50257, seq_len=1024)
    gpt2 = ModelConfig(name="gpt", args=dict(n_layer=12, n_head=12, n_embd=768))
    rss_before_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start_s = time.process_time()
    sim = simulate_step(gpt2, ADAMW, info, micro_batch_size=8)
    elapsed_s = time.process_time() - start_s
    rss_growth_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before_bytes
    assert sim.peak_bytes > 8 * 2**30  # what the step needs ...
    assert rss_growth_bytes < 2**30  # ... is never allocated
    assert elapsed_s < 60
    assert sim.param_count == 124_439_808


@pytest.fixture(scope="module")
def llama_7b_like():
    info = DataInfo("lm", "text", (2048,), "int64", 32000, vocab_size=32000, seq_len=2048)
    cfg = ModelConfig(name="gpt", args=dict(n_layer=32, n_head=32, n_embd=4096, tie_weights=False, bias=False))
    start_s = time.process_time()
    full = simulate_step(cfg, ADAMW, info, micro_batch_size=1, precision="bf16")
    sharded = simulate_step(cfg, ADAMW, info, micro_batch_size=1, precision="bf16", strategy="fsdp", world_size=8)
    return full, sharded, time.process_time() - start_s


@pytest.mark.slow
def test_7b_model_simulates_in_reasonable_time(llama_7b_like):
    full, _, elapsed_s = llama_7b_like
    assert elapsed_s < 120
    assert full.param_count == pytest.approx(6.7e9, rel=0.02)
    assert full.optimizer_state_bytes == pytest.approx(2 * 4 * full.param_count, rel=0.01)
    assert full.breakdown["optimizer_state"] >= full.optimizer_state_bytes
    assert full.peak_bytes > 16 * full.param_count * 0.9  # weights + grads + two moments, all fp32
    check_breakdown(full)


@pytest.mark.slow
def test_7b_under_fsdp8_holds_an_eighth_of_the_model_state_per_rank(llama_7b_like):
    full, sharded, _ = llama_7b_like
    assert sharded.param_count == full.param_count
    assert sharded.grad_bytes == full.grad_bytes  # what would be reduced, before sharding
    assert sharded.param_bytes == pytest.approx(full.param_bytes / 8, rel=0.01)
    assert sharded.optimizer_state_bytes == pytest.approx(full.optimizer_state_bytes / 8, rel=0.01)
    state = lambda sim: sum(sim.breakdown[k] for k in ("parameters", "gradients", "optimizer_state"))  # noqa: E731
    # at the peak a rank also holds the gathered block being computed, hence not exactly 1/8
    assert state(sharded) < 0.15 * state(full)
    assert sharded.peak_bytes < full.peak_bytes / 4
    check_breakdown(sharded)


# ---------------------------------------------------------------- user mistakes


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(precision="auto"), "train.precision"),
        (dict(strategy="zero3"), "distributed.strategy"),
        (dict(strategy="none", world_size=2), "world_size"),
        (dict(micro_batch_size=0), "train.micro_batch_size"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    kwargs = dict(dict(micro_batch_size=4), **kwargs)
    with pytest.raises(UserError, match=f"^{field}: "):
        simulate_step(SMALL_GPT, ADAMW, TEXT, **kwargs)


# ---------------------------------------------------------------- activation checkpointing wrapper


def test_blocks_are_found_generically():
    gpt, _ = build_model(SMALL_GPT, TEXT)
    assert [block for _, _, block in find_blocks(gpt)] == list(gpt.transformer.h)
    resnet, _ = build_model(ModelConfig(name="resnet", args=dict(depth=8)), DataInfo(
        "classification", "image", (3, 8, 8), "float32", 10, tuple("0123456789")))
    assert len(find_blocks(resnet)) == 3  # one basic block per stage
    cnn, _ = build_model(CNN, DIGITS)
    assert find_blocks(cnn) == []  # a flat stack of single layers has no blocks


def test_checkpointing_keeps_weights_outputs_and_gradients():
    torch.manual_seed(0)
    plain, spec = build_model(SMALL_GPT, TEXT)
    wrapped, _ = build_model(SMALL_GPT, TEXT)
    wrapped.load_state_dict(plain.state_dict())
    apply_activation_checkpointing(wrapped)
    assert wrapped.state_dict().keys() == plain.state_dict().keys()
    x = spec.example(2)
    for model in (plain, wrapped):
        model(x).square().mean().backward()
    torch.testing.assert_close(wrapped(x), plain(x))
    for p, q in zip(plain.parameters(), wrapped.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
