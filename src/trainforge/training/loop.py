"""THE training loop: one function, read top to bottom. It runs a resolved setup and decides nothing.

    setup = resolve(cfg, env, device, facts)        # training.setup: every concrete value, with its reason
    result = fit(setup, inputs)                     # training.run.run does both (trainforge.train calls it)

`fit` has three parts. Set up from the RunSetup: placement, the strategy's wrapping (activation checkpointing
-> DDP | FSDP2 -> compile), optimizer, the TrainState (restored from a checkpoint when resuming: weights,
optimizer, scaler, EMA, early stopping, counters, RNG last). The loop, per optimizer step: the LR for this
step (a pure function of the step) -> forward and backward over `accumulation` micro-batches under autocast,
the ranks agreeing on loss, out-of-memory and stop signals before the one backward that communicates -> skip
the update if the loss is not finite -> unscale, clip, optimizer step, EMA; then, when due, a train row, an
evaluation (val row, early stopping, best weights), a checkpoint. Finish: the final model (best > EMA > last),
test metrics, report.

Out of memory inside a step: the resolver gives the smaller setup (the largest divisor of the rank's share that
is at most half the micro-batch, accumulation raised to match) and the same step is retried on the same samples
— or, where the ranks cannot agree in place, the strategy has the group restart smaller (`training.strategy`).
SIGTERM/SIGINT: every rank acts on it at the step whose agreement first sees it: that step finishes, a checkpoint is saved, return.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from trainforge.config import Config, EarlyStoppingConfig
from trainforge.data.base import DataBundle, DataInfo
from trainforge.data.stages.loader import TrainBatches, make_eval_loader
from trainforge.data.summary import runtime_line
from trainforge.data.text import save_tokenizer
from trainforge.engine.checkpoint import kept_weights, load_model_weights
from trainforge.engine.data_parallel import agree, barrier, broadcast_object, gather_objects, max_over_ranks
from trainforge.engine.early_stop import EarlyStopper
from trainforge.engine.hooks import FitHooks, LossFn  # noqa: F401  (FitHooks: importable from here too)
from trainforge.engine.ema import EMA
from trainforge.engine.metrics import MetricsLog, NullLog, Window, truncate_metrics
from trainforge.engine.optim import build_optimizer, set_lr
from trainforge.engine.precision import autocast, make_scaler
from trainforge.engine.preflight import DataFacts
from trainforge.engine.progress import TrainProgress, announce_line
from trainforge.engine.rng import get_rng_state, seed_everything
from trainforge.engine.schedule import lr_at
from trainforge.engine.signals import StopFlag
from trainforge.errors import JobFailed, UserError
from trainforge.files import write_text_atomic
from trainforge.hardware.device import empty_cache, is_oom, reset_peak_memory
from trainforge.layout import CHECKPOINTS, DATA_REPORT, EVAL, METRICS, REPORT, SAMPLES, TENSORBOARD, VAL_IMAGES
from trainforge.models.lora import base_reference
from trainforge.training.artifacts import info_to_dict, save_final_model
from trainforge.training.evaluate import evaluate_model
from trainforge.training.setup import OOMNote, RunSetup
from trainforge.training.state import RunFacts, TrainState
from trainforge.training.strategy import STRATEGIES, Strategy
from trainforge.tasks import Task, task_of
from trainforge.tasks.batch import to_device

@dataclass
class TrainResult:
    run_dir: Path
    status: str  # completed | early_stopped | interrupted | pruned
    steps: int
    eval: dict[str, Any] = field(default_factory=dict)  # test metrics of the final model (eval.json)
    val: dict[str, Any] = field(default_factory=dict)  # last validation metrics
    skipped_steps: int = 0
    micro_batch_size: int = 0
    data: dict[str, Any] = field(default_factory=dict)  # rows read / kept / dropped by reason, splits, warnings
    setup: Optional[RunSetup] = None  # the setup the run ended with (smaller than the first after out of memory)


@dataclass
class RunInputs:
    """What a run is made of before its first step (`training.run.run` builds it and resolves the setup). The loop
    reads no config: what it needs is in its RunSetup (`setup.loop`) and here."""

    config: Config  # recorded with the final model and in every checkpoint (never read by the loop)
    run_dir: Path
    data: DataBundle
    model: nn.Module  # built on the CPU from the run's seed: the same initial weights on every rank
    facts: DataFacts
    stop: StopFlag
    reresolve: Callable[[OOMNote], RunSetup]  # the setup again, smaller, after running out of memory
    rebuild_model: Callable[[DataInfo], nn.Module]  # a fresh model of the same architecture (FSDP's final eval)
    resume_from: Optional[Path] = None  # a checkpoint verified before the setup was resolved
    data_counts: dict[str, Any] = field(default_factory=dict)
    eval_samples: Optional[Callable[[nn.Module, int], None]] = None  # the run's extra at each evaluation (rank 0)


def fit(setup: RunSetup, inputs: RunInputs, hooks: Optional[FitHooks] = None) -> TrainResult:
    hooks = hooks or FitHooks()
    loop, run_dir, info, stop = setup.loop, inputs.run_dir, inputs.data.info, inputs.stop
    env, device = setup.env, setup.device
    assert loop is not None, "a RunSetup from training.setup.resolve"

    # ================================================================ set up from the RunSetup
    strategy = STRATEGIES.get(setup.strategy)(env, device)
    model = inputs.model.to(device, memory_format=torch.channels_last) if setup.channels_last else inputs.model.to(device)
    step_model = strategy.wrap(model, setup)
    if env.rank:  # each rank its own dropout stream; rank 0 keeps the single-process one
        seed_everything(loop.seed + 7919 * env.rank)
    optimizer = build_optimizer(model, loop.optim)
    es = loop.early_stopping
    state = TrainState(setup, make_scaler(device, setup.precision), ema=EMA(model, loop.ema_decay) if loop.ema_decay else None,
                       stopper=stopper_for(es, task_of(info)) if es else None)
    if inputs.resume_from is not None:  # weights, optimizer, scaler, EMA, early stopping, counters; the RNG last
        payload, groups = strategy.restore(inputs.resume_from, model, optimizer,
                                           state.templates(kept_weights(model, model.state_dict()), strategy.snapshot))
        state = TrainState.from_checkpoint(payload, groups, setup, state.scaler, ema=state.ema, stopper=state.stopper,
                                           rank=env.rank)
    if env.is_main:
        truncate_metrics(run_dir / METRICS, after_step=state.step)
        truncate_metrics(run_dir / SAMPLES, after_step=state.step)  # a chat run's answers, likewise
    batches = TrainBatches(inputs.data.train, seed=loop.seed, micro_batch_size=setup.micro_batch_size,
                           global_batch_size=setup.global_batch_size, num_workers=setup.num_workers,
                           pin_memory=setup.pin_memory, rank=env.rank, world_size=env.world_size,
                           collate=task_of(info).collator(info, train=True))
    # evaluation runs at the training micro-batch: a forward pass at the size the run was planned and fitted for
    # needs less memory than that training step. A floor of 64 used to hold GPT-2 at 1,024 tokens at 51-60 GiB on an
    # H200 whatever the micro-batch (logits over a 50k vocabulary), an OOM on a 24-48 GiB GPU where training fits.
    val_loader = make_eval_loader(inputs.data.val, batch_size=setup.micro_batch_size, num_workers=setup.num_workers,
                                  pin_memory=setup.pin_memory, collate=task_of(info).collator(info, train=False))
    facts = RunFacts(loop.seed, loop.config_yaml, info_to_dict(info), inputs.data.preprocess, base_reference(model))
    # one voice: rank 0 logs and shows progress
    metrics = (MetricsLog(run_dir / METRICS, run_dir / TENSORBOARD if loop.tensorboard else None)
               if env.is_main else NullLog())
    progress = TrainProgress(setup.total_steps, state.step, enabled=loop.progress and env.is_main, speaks=env.is_main)
    for note in setup.notes:
        progress.log(note)
    if state.step:
        progress.log(f"resumed at step {state.step} of {setup.total_steps} (epoch {state.epoch})")
    answers = inputs.eval_samples if env.is_main else None
    window, it = Window(), None
    reset_peak_memory(device)
    model.train()
    class_weights = (None if setup.class_weights is None  # train.class_weights, as resolved
                     else torch.tensor(setup.class_weights, dtype=torch.float32, device=setup.device))

    # ================================================================ the loop
    try:
        for step in range(state.step, setup.total_steps):
            epoch, position = divmod(step, setup.steps_per_epoch)
            if it is None or position == 0:
                it = batches.at(epoch, position)
            lr = lr_at(step, base_lr=loop.optim.lr, total_steps=setup.total_steps, cfg=loop.schedule)
            set_lr(optimizer, lr)

            # forward + backward; out of memory on any rank before the communicating backward: every rank
            # retries the same samples with the smaller setup the resolver gives
            rng_at_step = torch.get_rng_state()
            while True:
                out = forward_backward(step_model, it, strategy, state, run_dir, step, stop, task=task_of(info),
                                       label_smoothing=loop.label_smoothing, loss_name=loop.loss, loss_fn=hooks.loss,
                                       class_weights=class_weights)
                if not out.oom:
                    break
                state.setup = inputs.reresolve(OOMNote(state.setup.micro_batch_size, step + 1))
                progress.log(f"[yellow]{state.setup.reasons['micro_batch_size']}")
                optimizer.zero_grad(set_to_none=True)
                empty_cache(device)
                torch.set_rng_state(rng_at_step)
                it = batches.at(epoch, position, state.setup.micro_batch_size)
            # the stop the ranks agreed on at this step: a signal that lands after the agreement (in the last
            # backward, say) is acted on at the next step's, or one rank would checkpoint while another steps on
            stopping = out.stop
            if stopping and not stop:
                stop.signal_name = "SIGTERM (another rank)"

            # a non-finite loss skips the update; too many in a row end the run (last checkpoint intact)
            grad_norm = None
            if math.isfinite(out.loss):
                state.bad_steps_in_row = 0
                state.scaler.unscale_(optimizer)
                grad_norm = grad_norm_and_clip(model, loop.grad_clip_norm, measure=(step + 1) % loop.log_every_steps == 0)
                state.scaler.step(optimizer)
                state.scaler.update()
                if state.ema is not None:
                    state.ema.update(model)
                window.add(out.loss, out.data_wait_s)
            else:
                skip_step(state, out.loss, step + 1, loop.max_bad_steps, run_dir, progress)
            optimizer.zero_grad(set_to_none=True)
            state.step = done = step + 1

            # log a train row
            if done % loop.log_every_steps == 0 or done == setup.total_steps:
                row = window.row(device, setup.global_batch_size)
                row["peak_mem_bytes"] = int(max_over_ranks(env, device, row["peak_mem_bytes"]))
                row.update(split="train", step=done, epoch=round(done / setup.steps_per_epoch, 4), lr=lr,
                           grad_norm=grad_norm, micro_batch_size=state.setup.micro_batch_size,
                           accumulation=state.setup.accumulation)
                metrics.log(row)
                progress.update(done, epoch, row["loss"], lr, row["samples_per_s"])
                window = Window()

            # evaluate: val row, early stopping, best weights, a tuner's verdict
            if done % setup.eval_every_steps == 0 or done == setup.total_steps:
                evaluate_and_track(state, model, strategy, val_loader, info, metrics, progress, hooks.on_eval,
                                   samples=answers, picture=run_dir / VAL_IMAGES)

            # checkpoint when due (not amid a run of non-finite losses), at the end, on a signal, on early stop
            due = (done % setup.checkpoint_every_steps == 0 or done == setup.total_steps) and state.bad_steps_in_row == 0
            if due or stopping or state.status != "completed":
                payload, groups = state.to_checkpoint(facts, gather_objects(env, get_rng_state()))
                strategy.save(run_dir / CHECKPOINTS, done, model, optimizer, payload, groups, loop.keep_checkpoints)
            if stopping:
                state.status = "interrupted"
                progress.log(f"{stop.signal_name}: checkpoint saved at step {done}; resume with --resume auto")
            if state.status != "completed":
                break
    finally:
        progress.close()
        metrics.close()

    # ================================================================ finish
    result = TrainResult(run_dir, state.status, state.step, val=state.val, skipped_steps=state.skipped_steps,
                         micro_batch_size=state.setup.micro_batch_size, data=inputs.data_counts, setup=state.setup)
    if state.status not in ("interrupted", "pruned"):
        finish(state, model, strategy, inputs, inputs.rebuild_model, result)
    del model, optimizer, step_model
    empty_cache(device)  # the run is over: give its cached memory back before the caller goes on
    barrier(env)
    return result


@dataclass(frozen=True)
class StepOutcome:
    loss: float  # the step's mean loss, averaged over the ranks (not finite when any rank's is not)
    oom: bool  # some rank ran out of memory before the communicating backward: retry the step smaller
    stop: bool  # some rank got SIGTERM/SIGINT
    data_wait_s: float  # mean over the ranks


def stopper_for(es: EarlyStoppingConfig, task: Task) -> EarlyStopper:
    """train.early_stopping with its defaults filled from the task: its default metric, the metric's direction."""
    metric = es.metric or task.default_metric
    return EarlyStopper(metric, es.mode or task.direction(metric), es.patience, es.min_delta)


def forward_backward(step_model: nn.Module, batches: Iterator, strategy: Strategy, state: TrainState, run_dir: Path,
                     step: int, stop: StopFlag, *, task: Task, label_smoothing: float, loss_name: Optional[str] = None,
                     class_weights: Optional[torch.Tensor] = None,
                     loss_fn: Optional[LossFn] = None) -> StepOutcome:
    """Accumulate gradients of the mean loss over `accumulation` micro-batches.

    Each micro-batch's loss is divided by `accumulation`, so the summed gradients equal those of one batch
    `accumulation` times larger (micro-batches are equal-sized). Every micro-batch but the last runs forward
    and backward without communication; then the last one's forward; then the ranks agree (loss, out of
    memory, stop); then, unless some rank ran out of memory, the last backward, in which DDP all-reduces each
    gradient bucket as soon as it is ready and FSDP reduce-scatters.
    """
    setup, scaler = state.setup, state.scaler
    device, accumulation = setup.device, setup.accumulation
    total = torch.zeros((), device=device)
    wait_s, oom, last = 0.0, False, None
    try:
        for i in range(accumulation):
            with strategy.micro_batch(last=i == accumulation - 1):
                t0 = time.perf_counter()
                batch = next(batches)
                wait_s += time.perf_counter() - t0
                batch = to_device(batch, device, channels_last=setup.channels_last)
                with autocast(device, setup.precision):
                    output = task.forward(step_model, batch)
                if loss_fn is not None:
                    loss = loss_fn(output, batch) / accumulation
                else:
                    named: dict[str, Any] = {} if loss_name is None else {"loss": loss_name}  # a plug-in task of one loss takes none
                    if class_weights is not None:
                        named["class_weights"] = class_weights
                    loss = task.training_loss(output, batch, label_smoothing=label_smoothing, **named) / accumulation
                del output, batch  # not needed by backward (the loss keeps what it needs): one output less at the peak
                total += loss.detach()
                if i < accumulation - 1:
                    scaler.scale(loss).backward()
                else:
                    last = loss
    except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled, the rest re-raised
        if not is_oom(exc):
            raise
        del exc
        strategy.out_of_memory(run_dir, setup.micro_batch_size, step + 1, communicating=False)  # FSDP: restart
        oom, last = True, None
    agreed = agree(setup.env, device, 0.0 if oom else total.item(), oom, bool(stop), wait_s)
    if agreed.oom:
        return StepOutcome(agreed.loss, True, agreed.stop, agreed.data_wait_s)
    try:
        with strategy.micro_batch(last=True), strategy.synced_backward():
            scaler.scale(last).backward()
    except Exception as exc:  # noqa: BLE001 - as above
        if not is_oom(exc):
            raise
        del exc
        last = None
        strategy.out_of_memory(run_dir, setup.micro_batch_size, step + 1, communicating=True)  # many ranks: restart
        return StepOutcome(agreed.loss, True, agreed.stop, agreed.data_wait_s)  # one process: retry in place
    return StepOutcome(agreed.loss, False, agreed.stop, agreed.data_wait_s)


def skip_step(state: TrainState, loss: float, step: int, max_bad_steps: int, run_dir: Path, progress: TrainProgress) -> None:
    """Count a non-finite loss; JobFailed (exit 1) after `max_bad_steps` in a row."""
    state.skipped_steps += 1
    state.bad_steps_in_row += 1
    progress.log(f"[yellow]step {step}: non-finite loss ({loss}), update skipped ({state.bad_steps_in_row} in a row)")
    if state.bad_steps_in_row >= max_bad_steps:
        raise JobFailed(
            f"{state.bad_steps_in_row} non-finite losses in a row at step {step}: the run diverged; lower optim.lr, "
            f"use train.precision=fp32 or bf16, or lower train.grad_clip_norm. The last good checkpoint is kept in "
            f"{run_dir / CHECKPOINTS}"
        )


def evaluate_and_track(state: TrainState, model: nn.Module, strategy: Strategy, val_loader, info: DataInfo,
                       metrics, progress: TrainProgress, on_eval: Optional[Callable[[int, dict], bool]],
                       samples: Optional[Callable[[nn.Module, int], None]] = None,
                       picture: Optional[Path] = None) -> None:
    """Evaluate on rank 0 (on every rank under FSDP, whose forward is a collective, and rank 0's numbers are
    then everyone's): val row, a chat run's answers to fixed validation prompts (`samples`), early stopping and
    best weights, a tuner's verdict; every rank ends with rank 0's status."""
    setup, done = state.setup, state.step
    env = setup.env
    if env.is_main or strategy.every_rank_evaluates:
        with state.ema.swapped_in(model) if state.ema else contextlib.nullcontext(), strategy.evaluating(model):
            val = evaluate_model(model, val_loader, info=info, device=setup.device, precision=setup.precision,
                                 picture=picture if env.is_main else None)
        empty_cache(setup.device)  # hand the evaluation's cached blocks back (CUDA): others share the GPU
        state.val = broadcast_object(env, val) if strategy.every_rank_evaluates else val
        row = {k: v for k, v in state.val.items() if k not in task_of(info).final_only}
        metrics.log({"split": "val", "step": done, "epoch": round(done / setup.steps_per_epoch, 4), **row})
        if samples is not None and env.is_main and not strategy.every_rank_evaluates:
            with state.ema.swapped_in(model) if state.ema else contextlib.nullcontext():
                samples(model, done)
        stopper = state.stopper
        if stopper is not None:
            if stopper.update(state.val, done):
                state.best = strategy.snapshot(kept_weights(model, state.ema.shadow if state.ema else model.state_dict()))
            if stopper.should_stop:
                state.status = "early_stopped"
                progress.log(f"early stopping at step {done}: no {stopper.metric} improvement "
                             f"in {stopper.patience} evaluations (best {stopper.best:.4f})")
        if on_eval is not None and on_eval(done, state.val):
            state.status = "pruned"
            progress.log(f"stopped at step {done}: the caller pruned this run")
    state.status = broadcast_object(env, state.status)


def finish(state: TrainState, model: nn.Module, strategy: Strategy, inputs: RunInputs,
           rebuild: Callable[[DataInfo], nn.Module], result: TrainResult) -> None:
    """The final model (best with early stopping > EMA > last weights) into final/, its test metrics into
    eval.json (and `result.eval`), report.html (with `log.report`). Every rank calls it; the weights are gathered once."""
    setup, info, run_dir = state.setup, inputs.data.info, inputs.run_dir
    weights = strategy.whole_weights(model, state.chosen_weights())  # a collective under FSDP
    if not setup.env.is_main:
        return
    if strategy.every_rank_evaluates:  # rank 0 evaluates a plain copy, not the sharded model
        model = rebuild(info).to(setup.device)
    load_model_weights(model, weights)
    final_step, final_val = state.step, state.val
    if state.best:  # the weights are those of the best evaluation: so are the step and metrics recorded
        final_step, final_val = state.stopper.best_step or state.step, state.stopper.best_metrics or state.val
    ran = {**setup.to_json(), "steps_trained": state.step}
    formats = model.native_formats() if hasattr(model, "native_formats") else {}  # hf: final/hf/ (+ adapter/)

    def with_tokenizer(write: Callable[[Path], None]) -> Callable[[Path], None]:
        def write_native(directory: Path) -> None:  # the model's own format, with the run's tokenizer beside it
            write(directory)
            save_tokenizer(inputs.data.preprocess, directory)
        return write_native

    save_final_model(run_dir, kept_weights(model, model.state_dict()), inputs.config, info, inputs.data.preprocess, final_step,
                     metrics=final_val, ran=ran, native={folder: with_tokenizer(w) for folder, w in formats.items()},
                     base=base_reference(model))
    test_loader = make_eval_loader(inputs.data.test, batch_size=setup.micro_batch_size, num_workers=0,
                                   pin_memory=setup.pin_memory, collate=task_of(info).collator(info, train=False))
    test = evaluate_model(model, test_loader, info=info, device=setup.device, precision=setup.precision, detailed=True)
    result.eval = {"split": "test", "step": final_step, **test}
    write_text_atomic(run_dir / EVAL, json.dumps(result.eval, indent=1))
    if inputs.data.runtime_report is not None:  # image files that failed to decode in any rank or worker
        found = inputs.data.runtime_report()
        report = {**inputs.data.report, "dropped_at_run_time": found}
        write_text_atomic(run_dir / DATA_REPORT, json.dumps(report, indent=1))
        announce_line(runtime_line(found))
    if setup.loop.report:
        from trainforge.report import write_report  # heavy (matplotlib, about 0.4 s): only a run that writes its report

        try:
            write_report(run_dir)
        except Exception as e:  # the run's last promise: a run whose report cannot be written has failed (exit 2)
            raise UserError(f"{run_dir / REPORT}: cannot be written ({type(e).__name__}: {str(e)[:200]}); the final "
                            f"model and eval.json are kept; `trainforge runs report {run_dir}` writes it again") from None


def grad_norm_and_clip(model: nn.Module, max_norm: Optional[float], measure: bool) -> Optional[float]:
    """Clip to `max_norm` (the norm comes for free); without clipping, measure only when logging."""
    if max_norm is None and not measure:
        return None
    params = [p for p in model.parameters() if p.grad is not None]
    if max_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP: a DTensor
