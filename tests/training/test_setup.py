"""Resolve, then run: `resolve` decides every concrete value once, with the reason; `fit` only runs it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import trainforge
from trainforge.data import build_data
from trainforge.engine.env import DistEnv
from trainforge.errors import JobFailed, UserError
from trainforge.planning.auto import MemoryBudget
from trainforge.planning.memory import SAFETY_MARGIN
from trainforge.training import run
from trainforge.training.setup import DataFacts, OOMNote, resolve
from trainforge.training.state import RunFacts, TrainState
from trainforge.engine.early_stop import EarlyStopper
from trainforge.engine.ema import EMA
from trainforge.engine.precision import make_scaler
from trainforge.engine.rng import get_rng_state

from test_loop import tiny

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def facts() -> DataFacts:
    data = build_data(tiny().data, seed=0)
    return DataFacts(data.info, len(data.train), convolutional=False)


def test_values_taken_as_asked_have_no_reason_and_the_rest_say_why(facts):
    setup = resolve(tiny("train.global_batch_size=64", "train.micro_batch_size=16", "train.precision=fp32"),
                    DistEnv(), CPU, facts)
    assert (setup.micro_batch_size, setup.accumulation, setup.precision, setup.strategy) == (16, 4, "fp32", "none")
    assert "micro_batch_size" not in setup.reasons and "precision" not in setup.reasons
    assert setup.reasons["strategy"] == "auto: none (one process)" and setup.reasons["device"].startswith("auto: cpu")
    assert setup.steps_per_epoch == facts.train_samples // 64 and setup.total_steps == setup.steps_per_epoch  # 1 epoch
    assert setup.eval_every_steps == setup.steps_per_epoch  # default: once per epoch
    assert setup.notes == ()  # nothing the config asked for in so many words was changed
    auto = resolve(tiny("train.precision=auto"), DistEnv(), CPU, facts)
    assert auto.precision == "fp32" and auto.reasons["precision"] == "auto: fp32 on the CPU" and auto.notes == ()


def test_an_explicit_value_that_had_to_change_is_said(facts):
    setup = resolve(tiny("train.global_batch_size=100", "train.micro_batch_size=64", "distributed.strategy=ddp"),
                    DistEnv(), CPU, facts)
    assert setup.micro_batch_size == 50 and setup.accumulation == 2
    assert len(setup.notes) == 2 and "64 -> 50" in setup.notes[0] and "ddp -> none" in setup.notes[1]
    two = resolve(tiny("train.global_batch_size=64", "train.micro_batch_size=64"), DistEnv(world_size=2), CPU, facts)
    assert (two.micro_batch_size, two.strategy, two.world_size) == (32, "ddp", 2)
    with pytest.raises(UserError, match="does not split evenly over 3 processes"):
        resolve(tiny(), DistEnv(world_size=3), CPU, facts)
    with pytest.raises(UserError, match="distributed.strategy: none cannot run on 2 processes"):
        resolve(tiny("distributed.strategy=none"), DistEnv(world_size=2), CPU, facts)


def test_the_micro_batch_precedence_is_oom_then_checkpoint_then_config_then_auto(facts):
    cfg = tiny("train.global_batch_size=32", "train.micro_batch_size=32")
    saved = {"micro_batch_size": 8, "step": 40}
    assert resolve(cfg, DistEnv(), CPU, facts).micro_batch_size == 32
    from_ckpt = resolve(cfg, DistEnv(), CPU, facts, checkpoint=saved)
    assert from_ckpt.micro_batch_size == 8 and "checkpoint of step 40 ran 8" in from_ckpt.reasons["micro_batch_size"]
    after_oom = resolve(cfg, DistEnv(), CPU, facts, checkpoint=saved, oom=OOMNote(8, step=41))
    assert (after_oom.micro_batch_size, after_oom.accumulation) == (4, 8)
    assert after_oom.reasons["micro_batch_size"].startswith("out of memory at step 41 with micro-batch 8 (in this run)")
    restarted = resolve(cfg, DistEnv(world_size=2), CPU, facts, oom=OOMNote(16, step=3, restarted=True))
    assert restarted.micro_batch_size == 8 and "before the group restarted" in restarted.reasons["micro_batch_size"]
    # a checkpoint never lets a run grow past the config's bound, and an auto run keeps the checkpoint's size
    assert resolve(tiny("train.global_batch_size=32", "train.micro_batch_size=4"), DistEnv(), CPU, facts,
                   checkpoint={"micro_batch_size": 16, "step": 2}).micro_batch_size == 4
    auto = resolve(tiny("train.global_batch_size=32", "train.micro_batch_size=auto"), DistEnv(), CPU, facts,
                   checkpoint={"micro_batch_size": 16, "step": 2})
    assert auto.micro_batch_size == 16 and auto.predicted_peak_bytes is None  # the planner was not asked
    with pytest.raises(JobFailed, match="cannot shrink further"):
        resolve(cfg, DistEnv(), CPU, facts, oom=OOMNote(1, step=1))


def test_auto_asks_the_planner_against_the_budget_given(facts):
    cfg = tiny("train.global_batch_size=64", "train.micro_batch_size=auto")
    roomy = resolve(cfg, DistEnv(), CPU, facts, budget=MemoryBudget(8 * 2**30, "the test's budget"))
    assert roomy.micro_batch_size == 64 and 0 < roomy.predicted_peak_bytes < 8 * 2**30
    assert "the test's budget" in roomy.reasons["micro_batch_size"] and roomy.notes
    one = resolve(tiny("train.global_batch_size=64", "train.micro_batch_size=1"), DistEnv(), CPU, facts,
                  budget=MemoryBudget(8 * 2**30, "a slot"), predict=True).predicted_peak_bytes
    budget = int((one + roomy.predicted_peak_bytes) / 2 / SAFETY_MARGIN)  # usable: halfway between 1 and 64
    tight = resolve(cfg, DistEnv(), CPU, facts, budget=MemoryBudget(budget, "tight"))
    assert 1 <= tight.micro_batch_size < 64 and tight.predicted_peak_bytes <= budget * SAFETY_MARGIN
    fixed = resolve(tiny("train.global_batch_size=64", "train.micro_batch_size=64"), DistEnv(), CPU, facts,
                    budget=MemoryBudget(8 * 2**30, "a slot"), predict=True)
    assert fixed.predicted_peak_bytes == roomy.predicted_peak_bytes  # the same simulation at the same size


def test_channels_last_and_workers_follow_the_device(facts):
    conv = DataFacts(facts.info, facts.train_samples, convolutional=True)
    gpu = resolve(tiny("data.num_workers=auto"), DistEnv(), torch.device("cuda", 0), conv, bf16_supported=False)
    assert gpu.channels_last and gpu.pin_memory and gpu.precision == "fp16" and gpu.num_workers >= 0
    assert "no bf16" in gpu.reasons["precision"] and "a CNN on CUDA" in gpu.reasons["channels_last"]
    cpu = resolve(tiny("data.num_workers=auto"), DistEnv(), CPU, conv)
    assert not cpu.channels_last and cpu.num_workers == 0 and not cpu.pin_memory


def test_a_run_resolves_once_and_again_only_after_running_out_of_memory(tmp_path: Path, monkeypatch):
    calls = []

    def counting(real):
        def wrapper(*args, **kwargs):
            calls.append(kwargs.get("oom"))
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(run, "resolve", counting(run.resolve))  # the loop's re-resolve after OOM is the run's too
    trainforge.train(tiny("train.max_steps=3"), run_dir=tmp_path / "plain")
    assert calls == [None]
    calls.clear()
    result = trainforge.train(tiny("model.name=custom", "model.target=loop_models:oom_above", "model.args={limit: 8}",
                                   "train.max_steps=3"), run_dir=tmp_path / "oom")
    assert [c.micro_batch_size if c else None for c in calls] == [None, 32, 16]  # 32 -> 16 -> 8, then it fits
    assert result.setup.micro_batch_size == 8


def test_train_state_goes_into_a_checkpoint_and_comes_back(facts):
    cfg = tiny("train.global_batch_size=32", "train.micro_batch_size=16")
    setup = resolve(cfg, DistEnv(), CPU, facts)
    model = torch.nn.Linear(4, 2)
    state = TrainState(setup, make_scaler(CPU, "fp32"), ema=EMA(model, 0.5),
                       stopper=EarlyStopper("accuracy", "max", patience=3), step=7, skipped_steps=2, bad_steps_in_row=1)
    state.stopper.update({"accuracy": 0.5, "loss": 1.0}, step=6)
    with torch.no_grad():
        model.weight.add_(1.0)
    state.ema.update(model)
    state.best = {k: v.clone() for k, v in model.state_dict().items()}
    rng = get_rng_state()
    payload, groups = state.to_checkpoint(RunFacts(0, cfg.to_yaml(), {"task": "classification"}, {}), [rng])
    assert payload["step"] == 7 and payload["micro_batch_size"] == 16 and payload["accumulation"] == 2
    assert payload["start_sample"] == (7 % setup.steps_per_epoch) * 32 and "ema" not in payload
    expected_shadow = {k: v.clone() for k, v in state.ema.shadow.items()}
    torch.rand(5)  # move the RNG on: from_checkpoint must bring it back
    fresh_model = torch.nn.Linear(4, 2)
    back = TrainState.from_checkpoint(payload, groups, setup, make_scaler(CPU, "fp32"), ema=EMA(fresh_model, 0.5),
                                      stopper=EarlyStopper("accuracy", "max", patience=3), rank=0)
    assert (back.step, back.skipped_steps, back.bad_steps_in_row, back.epoch) == (7, 2, 1, state.epoch)
    assert back.stopper.best == 0.5 and back.stopper.best_step == 6
    assert all(torch.equal(back.ema.shadow[k], expected_shadow[k]) for k in expected_shadow)
    assert all(torch.equal(back.best[k], state.best[k]) for k in state.best)
    assert torch.equal(torch.get_rng_state(), rng["torch"])
    assert back.chosen_weights() is back.best  # best > EMA > last


def test_auto_plans_with_the_pre_flights_model_and_builds_none_of_its_own(tmp_path, monkeypatch):
    """Issue 39: a run's `micro_batch_size: auto` reads the model facts of the one pre-flight (train.freeze applied
    there), and the planner builds no second model for them. Any build by the planner's own path fails this test."""
    from trainforge.engine.preflight import preflight
    from trainforge.planning import plan as plan_module

    def no_second_build(*args, **kwargs):
        raise AssertionError("the planner built the run's model a second time")

    monkeypatch.setattr(plan_module, "build_model", no_second_build)
    cfg = tiny("train.micro_batch_size=auto", "train.global_batch_size=64", "train.freeze=['1.*']")
    pre = preflight(cfg, fit_stats=False, on_meta=True)
    assert pre.facts.model is not None and pre.facts.model.frozen_bytes > 0  # described after train.freeze
    setup = resolve(cfg, DistEnv(), CPU, pre.facts, budget=MemoryBudget(2**30, "a test's budget"))
    assert setup.micro_batch_size >= 1 and "auto" in setup.reasons["micro_batch_size"]
    result = trainforge.train(tiny("train.micro_batch_size=auto", "train.max_steps=2"),
                              run_dir=tmp_path / "run")
    assert result.steps == 2
