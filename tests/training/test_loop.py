"""The training loop: accumulation, OOM recovery, non-finite losses, EMA, early stopping, compile, resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import trainforge
from trainforge.errors import JobFailed, UserError
from trainforge.engine.checkpoint import find_resume_checkpoint, verify_checkpoint
from trainforge.engine.metrics import read_metrics

TINY = [
    "data.source=digits",
    "data.augment.rotation_deg=0",
    "data.augment.crop_scale=null",
    "model.name=mlp",
    "model.args={hidden: [32], dropout: 0.0}",
    "train.epochs=1",
    "train.global_batch_size=32",
    "train.micro_batch_size=32",
    "train.early_stopping=null",
    "train.deterministic=true",
    "log.progress=false",
    "log.tensorboard=false", "log.report=false",
]


def tiny(*extra: str):
    return trainforge.load_config(None, [*TINY, *extra])


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, exact: bool = True) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_run_dir_has_every_artifact(tmp_path: Path):
    result = trainforge.train(tiny("log.tensorboard=true", "log.report=true"), run_dir=tmp_path / "run")
    run = result.run_dir
    for name in ("config.yaml", "metrics.jsonl", "data_report.json", "eval.json", "report.html",
                 "final/model.safetensors", "final/model.json", "checkpoints/latest"):
        assert (run / name).exists(), name
    assert list((run / "tensorboard").iterdir())
    rows = read_metrics(run / "metrics.jsonl")
    train_rows = [r for r in rows if r["split"] == "train"]
    assert {"step", "epoch", "loss", "lr", "samples_per_s", "step_time_s", "data_wait_frac",
            "peak_mem_bytes", "grad_norm"} <= set(train_rows[0])
    assert all(0.0 <= r["data_wait_frac"] <= 1.0 for r in train_rows)
    val_rows = [r for r in rows if r["split"] == "val"]
    assert {"step", "epoch", "loss", "accuracy", "macro_f1"} <= set(val_rows[-1])
    ev = json.loads((run / "eval.json").read_text())
    assert ev["split"] == "test" and ev["accuracy"] > 0.5 and len(ev["confusion_matrix"]) == 10
    assert result.eval["accuracy"] == ev["accuracy"]


def test_accumulation_matches_one_large_batch(tmp_path: Path):
    """4 micro-batches of 8 accumulate to the same update as one batch of 32."""
    big = trainforge.train(tiny("train.max_steps=3"), run_dir=tmp_path / "big")
    small = trainforge.train(tiny("train.max_steps=3", "train.micro_batch_size=8"), run_dir=tmp_path / "small")
    assert_same_weights(final_weights(big.run_dir), final_weights(small.run_dir), exact=False)
    # and the two are not trivially equal to the initial weights
    assert big.steps == small.steps == 3


@pytest.mark.parametrize("norm, equivalent", [("group", True), ("batch", False)])
def test_accumulation_equals_one_large_batch_only_without_batch_statistics(tmp_path: Path, norm: str, equivalent: bool):
    """What docs/architecture.md claims: accumulation is one large batch for models that treat samples
    independently (GroupNorm); BatchNorm normalizes each micro-batch with its own statistics, so it is not."""
    cnn = ("model.name=cnn", f"model.args={{channels: [8, 8], dropout: 0.0, norm: {norm}}}", "train.max_steps=3")
    big = trainforge.train(tiny(*cnn), run_dir=tmp_path / "big")
    small = trainforge.train(tiny(*cnn, "train.micro_batch_size=4"), run_dir=tmp_path / "small")
    a, b = final_weights(big.run_dir), final_weights(small.run_dir)
    largest = max(float((a[k].float() - b[k].float()).abs().max()) for k in a if a[k].is_floating_point())
    # float rounding differs between the two (Adam's normalization magnifies it to ~1e-5); BatchNorm's
    # per-micro-batch statistics move the weights by orders of magnitude more
    assert (largest < 1e-4) if equivalent else (largest > 1e-3), largest


def test_oom_halves_micro_batch_and_keeps_the_global_batch(tmp_path: Path):
    common = ("model.name=custom", "model.target=loop_models:oom_above", "train.max_steps=4")
    recovered = trainforge.train(tiny(*common, "model.args={limit: 8}"), run_dir=tmp_path / "oom")
    assert recovered.micro_batch_size == 8  # 32 -> 16 -> 8
    planned = trainforge.train(tiny(*common, "model.args={limit: 1000}", "train.micro_batch_size=8"), run_dir=tmp_path / "plan")
    # the retried step saw the same samples in the same order: identical to planning micro-batch 8 from the start
    assert_same_weights(final_weights(recovered.run_dir), final_weights(planned.run_dir))


def test_oom_that_cannot_shrink_further_fails_the_run(tmp_path: Path):
    cfg = tiny("model.name=custom", "model.target=loop_models:oom_above", "model.args={limit: 0}", "train.max_steps=2")
    with pytest.raises(JobFailed, match="cannot shrink further"):
        trainforge.train(cfg, run_dir=tmp_path / "run")


def test_oom_shrinks_an_odd_micro_batch_and_the_micro_batch_that_ran_is_recorded(tmp_path: Path):
    """15 (what `plan` recommends for some GPUs) cannot be halved: it shrinks to 6, the largest divisor of the
    rank's 30 samples that is at most half; the metrics rows, final/model.json and the result say so."""
    common = ("model.name=custom", "model.target=loop_models:oom_above", "train.max_steps=3",
              "train.global_batch_size=30", "train.log_every_steps=1")
    recovered = trainforge.train(tiny(*common, "model.args={limit: 8}", "train.micro_batch_size=15"),
                                 run_dir=tmp_path / "oom")
    assert recovered.micro_batch_size == 6
    planned = trainforge.train(tiny(*common, "model.args={limit: 1000}", "train.micro_batch_size=6"),
                               run_dir=tmp_path / "plan")
    assert_same_weights(final_weights(recovered.run_dir), final_weights(planned.run_dir))
    rows = [r for r in read_metrics(recovered.run_dir / "metrics.jsonl") if r["split"] == "train"]
    assert [(r["micro_batch_size"], r["accumulation"]) for r in rows] == [(6, 5)] * 3
    meta = json.loads((recovered.run_dir / "final" / "model.json").read_text())
    ran = meta["ran"]
    assert {k: ran[k] for k in ("micro_batch_size", "accumulation", "world_size", "steps_trained")} == {
        "micro_batch_size": 6, "accumulation": 5, "world_size": 1, "steps_trained": 3}
    assert ran["reasons"]["micro_batch_size"].startswith("out of memory at step 1 with micro-batch 15")
    assert (ran["precision"], ran["strategy"], ran["device"]) == ("fp32", "none", "cpu")
    assert "micro_batch_size: 15" in (recovered.run_dir / "config.yaml").read_text()  # the request is kept


def test_micro_batch_size_is_an_upper_bound_fitted_to_the_global_batch(tmp_path: Path, capsys):
    result = trainforge.train(tiny("train.global_batch_size=100", "train.micro_batch_size=64", "train.max_steps=2",
                                   "train.log_every_steps=1"), run_dir=tmp_path / "run")
    assert result.micro_batch_size == 50
    err = capsys.readouterr().err
    assert err.count("train.micro_batch_size 64 -> 50") == 1, err
    rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["split"] == "train"]
    assert {(r["micro_batch_size"], r["accumulation"]) for r in rows} == {(50, 2)}


def test_evaluation_runs_at_the_training_micro_batch(tmp_path: Path):
    """Validation and test batches are never larger than the micro-batch the run was planned and fitted for."""
    seen: list[int] = []

    def record(module, args):
        if args and isinstance(args[0], torch.Tensor) and not module.training:
            seen.append(args[0].shape[0])

    handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        result = trainforge.train(tiny("train.micro_batch_size=8", "train.max_steps=2", "train.eval_every_steps=1"),
                                  run_dir=tmp_path / "run")
    finally:
        handle.remove()
    assert result.micro_batch_size == 8
    assert seen, "no evaluation forward was seen"
    assert max(seen) == 8, sorted(set(seen))


def test_cached_accelerator_memory_is_released_after_each_evaluation_and_at_the_end(tmp_path: Path, monkeypatch):
    from trainforge.training import loop

    calls = []
    monkeypatch.setattr(loop, "empty_cache", lambda device: calls.append(device.type))
    trainforge.train(tiny("train.max_steps=4", "train.eval_every_steps=2"), run_dir=tmp_path / "run")
    assert calls == ["cpu"] * 3  # two evaluations, then the end of the run


def test_empty_cache_reaches_the_device_module(monkeypatch):
    from trainforge.hardware import device as hw

    released = []
    fake = type("FakeCuda", (), {"empty_cache": staticmethod(lambda: released.append(True))})
    monkeypatch.setattr(hw, "_module", lambda name: fake if name == "cuda" else None)
    hw.empty_cache(torch.device("cuda"))
    hw.empty_cache(torch.device("cpu"))
    assert released == [True]


def test_a_non_finite_loss_skips_one_step(tmp_path: Path):
    cfg = tiny("model.name=custom", "model.target=loop_models:nan_on_calls", "model.args={bad_calls: [3]}", "train.max_steps=6")
    result = trainforge.train(cfg, run_dir=tmp_path / "run")
    assert result.status == "completed" and result.skipped_steps == 1
    assert all(torch.isfinite(t).all() for t in final_weights(result.run_dir).values())


def test_too_many_non_finite_losses_stop_the_run_and_keep_the_checkpoint(tmp_path: Path):
    cfg = tiny(
        "model.name=custom", "model.target=loop_models:nan_on_calls", "model.args={bad_calls: [5, 6, 7, 8]}",
        "train.max_steps=10", "train.checkpoint_every_steps=2", "train.max_bad_steps=3",
    )
    with pytest.raises(JobFailed, match="3 non-finite losses in a row"):
        trainforge.train(cfg, run_dir=tmp_path / "run")
    good = find_resume_checkpoint(tmp_path / "run" / "checkpoints")
    assert good is not None and good.name == "step-000004"
    verify_checkpoint(good)
    assert not (tmp_path / "run" / "final").exists()


def test_ema_weights_are_the_final_model(tmp_path: Path):
    plain = trainforge.train(tiny("train.max_steps=5"), run_dir=tmp_path / "plain")
    ema = trainforge.train(tiny("train.max_steps=5", "train.ema_decay=0.9"), run_dir=tmp_path / "ema")
    a, b = final_weights(plain.run_dir), final_weights(ema.run_dir)
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the EMA average, not the last weights


def test_early_stopping_on_a_metric_the_task_lacks_is_a_user_error(tmp_path: Path):
    with pytest.raises(UserError, match="train.early_stopping.metric: 'perplexity' is not reported for classification"):
        trainforge.train(tiny("train.early_stopping={metric: perplexity}"), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_early_stopping_stops_and_keeps_the_best(tmp_path: Path):
    cfg = tiny(
        "train.epochs=30", "train.eval_every_steps=2", "train.checkpoint_every_steps=2", "train.keep_checkpoints=10",
        "optim.lr=1e-3", "schedule.name=constant",
        "train.early_stopping={metric: accuracy, mode: max, patience: 2, min_delta: 0.5}",
    )
    result = trainforge.train(cfg, run_dir=tmp_path / "run")
    assert result.status == "early_stopped"
    assert result.steps == 6  # best at the first evaluation (step 2), then two without a 0.5 gain
    best = load_file(str(tmp_path / "run" / "checkpoints" / "step-000002" / "model.safetensors"))
    last = load_file(str(tmp_path / "run" / "checkpoints" / "step-000006" / "model.safetensors"))
    assert_same_weights(final_weights(result.run_dir), best)  # the best weights, not the last
    assert any(not torch.equal(best[k], last[k]) for k in best)
    # and the step and metrics recorded are those of the best evaluation, not of the last one
    val_at = {r["step"]: r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["split"] == "val"}
    meta = json.loads((result.run_dir / "final" / "model.json").read_text())
    assert meta["step"] == 2 and meta["ran"]["steps_trained"] == 6
    assert meta["metrics"]["accuracy"] == val_at[2]["accuracy"] and meta["metrics"]["loss"] == val_at[2]["loss"]
    assert val_at[6]["loss"] != val_at[2]["loss"]
    assert json.loads((result.run_dir / "eval.json").read_text())["step"] == 2


@pytest.mark.slow
def test_compile_on_cpu_trains_the_same(tmp_path: Path):
    eager = trainforge.train(tiny("train.max_steps=3"), run_dir=tmp_path / "eager")
    compiled = trainforge.train(tiny("train.max_steps=3", "train.compile=true"), run_dir=tmp_path / "compiled")
    assert_same_weights(final_weights(eager.run_dir), final_weights(compiled.run_dir), exact=False)


def test_a_run_dir_with_a_run_is_never_overwritten(tmp_path: Path):
    trainforge.train(tiny("train.max_steps=2"), run_dir=tmp_path / "run")
    before = (tmp_path / "run" / "final" / "model.safetensors").read_bytes()
    with pytest.raises(UserError, match="already holds a run; pass --resume auto"):
        trainforge.train(tiny("train.max_steps=2"), run_dir=tmp_path / "run")
    assert (tmp_path / "run" / "final" / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_checkpoints_and_resume_matches_uninterrupted(tmp_path: Path, sig: str):
    """SIGTERM or SIGINT during step 7 of 12: the step finishes, a checkpoint is saved, the run returns; resuming it
    ends with weights bit-identical to an uninterrupted run (dropout, augmentation and EMA included)."""
    extra = ("model.name=custom", "model.target=loop_models:signal_on_call", "train.max_steps=12",
             "data.augment.rotation_deg=15", "data.augment.crop_scale=[0.8, 1.0]", "train.ema_decay=0.9",
             "train.checkpoint_every_steps=5")
    full = trainforge.train(tiny(*extra, "model.args={call: -1}"), run_dir=tmp_path / "full")
    part = trainforge.train(tiny(*extra, f"model.args={{call: 7, sig: {sig}}}"), run_dir=tmp_path / "part")
    assert part.status == "interrupted" and part.steps == 7
    assert find_resume_checkpoint(tmp_path / "part" / "checkpoints").name == "step-000007"
    assert not (tmp_path / "part" / "final").exists()
    resumed = trainforge.train(None, overrides=["model.args={call: -1}"], run_dir=tmp_path / "part", resume="auto")
    assert resumed.status == "completed" and resumed.steps == 12
    assert_same_weights(final_weights(full.run_dir), final_weights(resumed.run_dir))
    steps = [r["step"] for r in read_metrics(tmp_path / "part" / "metrics.jsonl") if r["split"] == "train"]
    assert steps == sorted(set(steps))  # rows after the checkpoint were not duplicated


def test_sigterm_to_the_whole_process_group_with_data_workers_checkpoints_and_exits_0(tmp_path: Path):
    """torchrun, Slurm and the job server signal the trainer's whole process group, its data workers included
    (as Ctrl-C in a terminal does): the workers must leave the signal to the trainer, which checkpoints."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainforge", "train", *TINY, "train.max_steps=2000",
                             "train.device=cpu", "data.num_workers=2", "train.log_every_steps=1", "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while '"step": 3,' not in ((run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "SIGTERM: checkpoint saved at step" in err and find_resume_checkpoint(run_dir / "checkpoints") is not None


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu(tmp_path: Path, precision: str):
    """The autocast + GradScaler path of the loop (the same lines a GPU runs)."""
    result = trainforge.train(tiny("train.max_steps=4", f"train.precision={precision}"), run_dir=tmp_path / "run")
    assert result.status == "completed" and result.skipped_steps == 0
    assert all(torch.isfinite(t).all() for t in final_weights(result.run_dir).values())


def test_channels_last_path_trains_on_cpu(tmp_path: Path):
    cfg = tiny("model.name=cnn", "model.args={channels: [8, 16]}", "train.max_steps=3", "train.channels_last=true")
    assert trainforge.train(cfg, run_dir=tmp_path / "run").status == "completed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_auto_precision_and_peak_memory(tmp_path: Path):
    result = trainforge.train(tiny("train.max_steps=4", "train.device=cuda", "model.name=cnn"), run_dir=tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    assert result.status == "completed" and rows[-1]["peak_mem_bytes"] > 0


def test_activation_checkpointing_trains_the_same(tmp_path: Path):
    gpt = ["data.source=synthetic_text", "data.args={task: lm, num_samples: 200, seq_len: 16, vocab_size: 32}",
           "data.normalize=none", "model.name=gpt", "model.args={n_layer: 2, n_head: 2, n_embd: 16, dropout: 0.0}",
           "train.max_steps=3"]
    plain = trainforge.train(tiny(*gpt), run_dir=tmp_path / "plain")
    ckpt = trainforge.train(tiny(*gpt, "train.activation_checkpointing=true"), run_dir=tmp_path / "ckpt")
    assert_same_weights(final_weights(plain.run_dir), final_weights(ckpt.run_dir), exact=False)
