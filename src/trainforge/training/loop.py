"""THE training loop: one function, read top to bottom.

    result = fit(cfg, run_dir)                       # fresh run
    result = fit(cfg, run_dir, resume_from=ckpt)     # continue exactly where a checkpoint left off

Order of one optimizer step: set the LR for this step (a pure function of the step) -> forward and
backward over `accumulation` micro-batches under autocast -> skip the step if the loss is not finite
-> unscale, clip -> optimizer step -> EMA. Then, when due: log a train row, evaluate (val row, early
stopping), checkpoint. A CUDA out-of-memory error inside a step shrinks the micro-batch (to the largest
divisor of the rank's share that is at most half), raises the accumulation to match and retries the same
step on the same samples. SIGTERM/SIGINT finish the current step,
save a checkpoint and return.
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
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from trainforge.config import Config
from trainforge.data import build_data
from trainforge.data.summary import summarize
from trainforge.data.base import DataInfo
from trainforge.data.loader import (
    PositionBatchSampler,
    make_eval_loader,
    make_train_loader,
    resolve_num_workers,
    steps_per_epoch,
)
from trainforge.distributed.data_parallel import (
    agree,
    all_reduce_gradients,
    barrier,
    broadcast_object,
    broadcast_state,
    gather_objects,
    max_over_ranks,
)
from trainforge.distributed.env import distributed, resolve_strategy
from trainforge.distributed.parallelize import apply_activation_checkpointing, apply_fsdp
from trainforge.errors import JobFailed, UserError
from trainforge.hardware.device import empty_cache, is_oom, reset_peak_memory
from trainforge.models import build_model, is_convolutional
from trainforge.report import write_report
from trainforge.training.artifacts import info_to_dict, save_final_model
from trainforge.files import write_text_atomic
from trainforge.training.checkpoint import load_model_weights, save_checkpoint, save_sharded_checkpoint
from trainforge.training.early_stop import EarlyStopper
from trainforge.training.ema import EMA
from trainforge.training.evaluate import check_metric, evaluate_model
from trainforge.training.losses import task_loss
from trainforge.training.metrics import MetricsLog, NullLog, Window, truncate_metrics
from trainforge.training.microbatch import (
    OOM_RESTART_FILE,
    accumulation_steps,
    batch_geometry,
    fitting_micro_batch,
    read_oom_restart,
    request_oom_restart,
    shrink_micro_batch,
)
from trainforge.training.optim import build_optimizer, set_lr
from trainforge.training.precision import DTYPES, autocast, make_scaler, resolve_precision
from trainforge.training.progress import TrainProgress, announce_data
from trainforge.training.rng import determinism, get_rng_state, seed_everything, set_rng_state
from trainforge.training.schedule import lr_at
from trainforge.training.state import current_state, full_model_state, restore
from trainforge.training.signals import stop_on_signals


@dataclass
class FitHooks:
    """How another stage (tune, compress) steers one run without a second loop.

    build_model(info) -> nn.Module replaces the registry model (e.g. a pruned network; it must build the
        same architecture on resume). loss(logits, x, y) -> scalar replaces the task loss (e.g. distillation).
    on_eval(step, val_metrics) -> True ends the run after that evaluation with status "pruned" (a tuner's
        pruner); no final model is written then.
    """

    build_model: Optional[Callable[[DataInfo], nn.Module]] = None
    loss: Optional[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = None
    on_eval: Optional[Callable[[int, dict[str, Any]], bool]] = None


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


def fit(cfg: Config, run_dir: Path, resume_from: Optional[Path] = None, hooks: Optional[FitHooks] = None) -> TrainResult:
    run_dir = Path(run_dir)
    hooks = hooks or FitHooks()
    tc = cfg.train
    with contextlib.ExitStack() as stack:
        env, device = stack.enter_context(distributed(tc.device))
        precision = resolve_precision(tc.precision, device)
        stack.enter_context(determinism(tc.deterministic, tc.num_threads, device))
        stop = stack.enter_context(stop_on_signals())
        strategy = resolve_strategy(cfg.distributed.strategy, env)
        seed_everything(cfg.seed)  # the same initial weights on every rank (rank 0's are broadcast too)

        # ---- data and model
        data = build_data(cfg.data, seed=cfg.seed)
        info = data.info
        if cfg.model.pruned and hooks.build_model is None:
            raise UserError("model.pruned: this run fine-tunes a pruned model that `trainforge compress` builds; "
                            "rerun the same compress command (same --out) to continue it")
        model = hooks.build_model(info) if hooks.build_model else build_model(cfg.model, info)[0]
        if tc.early_stopping is not None:
            check_metric(tc.early_stopping.metric, info.task, "train.early_stopping.metric")
        if strategy == "fsdp" and (tc.ema_decay or tc.early_stopping):
            raise UserError("distributed.strategy: fsdp does not keep EMA or best weights yet; "
                            "set train.ema_decay=null and train.early_stopping=null, or use ddp")

        # ---- batch geometry: global = micro x accumulation x world size
        global_batch = tc.global_batch_size
        per_epoch = steps_per_epoch(len(data.train), global_batch)
        total_steps = tc.max_steps or tc.epochs * per_epoch
        auto_note = None
        if isinstance(tc.micro_batch_size, int):  # an upper bound: fitted to this world size's share
            geometry = batch_geometry(global_batch, tc.micro_batch_size, env.world_size)
            micro, auto_note = geometry.micro_batch_size, geometry.note
        elif resume_from is not None:
            micro = global_batch  # replaced by the checkpoint's micro-batch below
        else:  # the planner picks the largest that fits; OOM recovery below stays the safety net
            from trainforge.planning.auto import auto_micro_batch  # heavy (the fake-tensor simulator): only for auto

            choice = auto_micro_batch(cfg, info, device, precision, steps=total_steps, world_size=env.world_size)
            micro = choice.micro_batch_size
            auto_note = (f"train.micro_batch_size auto: {micro} (predicted peak {choice.predicted_peak_bytes / 2**20:.0f} "
                         f"MiB of a {choice.budget_bytes / 2**20:.0f} MiB budget)")
        accumulation = accumulation_steps(global_batch, micro, env.world_size)
        eval_every = tc.eval_every_steps or per_epoch
        ckpt_every = tc.checkpoint_every_steps or per_epoch

        # the run directory is created only once data and model are known to be good; rank 0 writes.
        # What cleaning dropped is said on the console then (bad input stays one line), not only in data_report.json
        data_summary = summarize(data.report)
        if env.is_main:
            announce_data(data_summary)
            run_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(run_dir / "config.yaml", cfg.to_yaml())
            write_text_atomic(run_dir / "data_report.json", json.dumps(data.report, indent=1))

        # ---- placement, then in this order: activation checkpointing -> compile -> FSDP; optimizer last
        channels_last = tc.channels_last is True or (
            tc.channels_last == "auto" and device.type == "cuda" and is_convolutional(model)
        )
        model.to(device, memory_format=torch.channels_last) if channels_last else model.to(device)
        broadcast_state(model, env)
        if env.rank:  # each rank its own dropout stream; rank 0 keeps the single-process one
            seed_everything(cfg.seed + 7919 * env.rank)
        if cfg.distributed.activation_checkpointing:
            apply_activation_checkpointing(model)
        step_model: nn.Module = torch.compile(model) if tc.compile else model
        if strategy == "fsdp":
            # the mesh reuses the default process group: a new group would leave rendezvous keys behind
            # that a torchrun restart of the group then trips over
            mesh = DeviceMesh.from_group(dist.group.WORLD, device.type)
            apply_fsdp(model, mesh, param_dtype=None if precision == "fp32" else DTYPES[precision])
        optimizer = build_optimizer(model, cfg.optim)
        scaler = make_scaler(device, precision)
        ema = EMA(model, tc.ema_decay) if tc.ema_decay else None
        es = tc.early_stopping
        stopper = EarlyStopper(es.metric, es.mode, es.patience, es.min_delta) if es else None
        best_state: dict[str, torch.Tensor] = {}

        # ---- resume: weights, optimizer, scaler, EMA, early stopping, counters, then RNG last
        start_step, skipped, bad_in_row = 0, 0, 0
        if resume_from is not None:
            state = restore(resume_from, model, optimizer, sharded_model=strategy == "fsdp")
            scaler.load_state_dict(state["scaler"])
            if ema is not None and state["ema"]:
                ema.load_state_dict(state["ema"])
            if stopper is not None and state["early_stop"]:
                stopper.load_state_dict(state["early_stop"])
            best_state = state["best_model"]
            start_step, skipped, bad_in_row = state["step"], state["skipped_steps"], state["bad_steps_in_row"]
            # the checkpoint's micro-batch may have been shrunk by OOM recovery; never grow past the config's,
            # and fit it to this run's world size
            saved = state["micro_batch_size"]
            wanted = saved if tc.micro_batch_size == "auto" else min(micro, saved)
            micro = fitting_micro_batch(wanted, global_batch, env.world_size)
            accumulation = accumulation_steps(global_batch, micro, env.world_size)
            rank_states = state.get("rng_ranks") or [state["rng"]]
            if env.rank < len(rank_states):  # same world size: every rank continues its own stream exactly
                set_rng_state(rank_states[env.rank])
        restarted_micro = read_oom_restart(run_dir)  # an FSDP group restarted after running out of memory
        if restarted_micro is not None and restarted_micro < micro:
            micro = restarted_micro
            accumulation = accumulation_steps(global_batch, micro, env.world_size)
        if env.is_main:
            truncate_metrics(run_dir / "metrics.jsonl", after_step=start_step)

        # ---- data loaders; the sampler makes the order a function of (seed, epoch)
        workers = resolve_num_workers(cfg.data.num_workers, device.type)
        pin = device.type == "cuda"
        sampler = PositionBatchSampler(
            len(data.train), seed=cfg.seed, micro_batch_size=micro, global_batch_size=global_batch,
            rank=env.rank, world_size=env.world_size,
        )
        loader = make_train_loader(data.train, sampler, num_workers=workers, pin_memory=pin)
        val_loader = make_eval_loader(data.val, batch_size=max(micro, 64), num_workers=workers, pin_memory=pin)

        def batches_from(epoch: int, position: int) -> Iterator:
            sampler.set_position(epoch, position * global_batch)
            return iter(loader)

        def evaluate_now(detailed: bool = False) -> dict[str, Any]:
            with ema.swapped_in(model) if ema else contextlib.nullcontext():
                return evaluate_model(model, val_loader, info=info, device=device, precision=precision, detailed=detailed)

        def checkpoint(done: int) -> None:
            rng_ranks = gather_objects(env, get_rng_state())
            model_sd, optim_sd = current_state(model, optimizer)
            state = {
                    "step": done,
                    "epoch": done // per_epoch,
                    "start_sample": (done % per_epoch) * global_batch,
                    "sampler_seed": cfg.seed,
                    "micro_batch_size": micro,
                    "accumulation": accumulation,
                    "scaler": scaler.state_dict(),
                    "ema": ema.state_dict() if ema else {},
                    "early_stop": stopper.state_dict() if stopper else {},
                    "best_model": best_state,
                    "skipped_steps": skipped,
                    "bad_steps_in_row": bad_in_row,
                    "rng": rng_ranks[0] if rng_ranks else {},  # gathered on rank 0 only
                    "rng_ranks": rng_ranks,
                    "world_size": env.world_size,
                    "config_yaml": cfg.to_yaml(),
                    "data_info_json": json.dumps(info_to_dict(info)),
                    "preprocess_json": json.dumps(data.preprocess),
            }
            root = run_dir / "checkpoints"
            if strategy == "fsdp":  # every rank writes its shards
                save_sharded_checkpoint(root, done, {"model": model_sd, "optimizer": optim_sd}, state,
                                        tc.keep_checkpoints, is_main=env.is_main, barrier=lambda: barrier(env))
            elif env.is_main:  # replicas are identical: rank 0 writes whole tensors
                save_checkpoint(root, done, model_sd, {**state, "optimizer": optim_sd}, keep=tc.keep_checkpoints)
            barrier(env)  # nobody moves on (or exits) before the checkpoint is complete
            if env.is_main:  # the checkpoint holds the micro-batch an OOM restart asked for: the request is done
                (run_dir / OOM_RESTART_FILE).unlink(missing_ok=True)

        # one voice: rank 0 logs and shows progress
        metrics = (MetricsLog(run_dir / "metrics.jsonl", run_dir / "tensorboard" if cfg.log.tensorboard else None)
                   if env.is_main else NullLog())
        progress = TrainProgress(total_steps, start_step, enabled=cfg.log.progress and env.is_main, speaks=env.is_main)
        if auto_note:
            progress.log(auto_note)
        if start_step:
            progress.log(f"resumed at step {start_step} of {total_steps} (epoch {start_step // per_epoch})")
        status, val, batches, done = "completed", {}, None, start_step
        window = Window()
        reset_peak_memory(device)
        model.train()
        try:
            # ================================================================ the loop
            for step in range(start_step, total_steps):
                epoch, position = divmod(step, per_epoch)
                if batches is None or position == 0:
                    batches = batches_from(epoch, position)
                lr = lr_at(step, base_lr=cfg.optim.lr, total_steps=total_steps, cfg=cfg.schedule)
                set_lr(optimizer, lr)

                # forward + backward over the micro-batches, no communication; then all ranks agree on
                # the loss, out-of-memory and stop signals; on OOM anywhere all retry the same samples smaller
                rng_at_step = torch.get_rng_state()
                while True:
                    oom = False
                    try:
                        loss_sum, wait_s = forward_backward(
                            step_model, batches, accumulation, device=device, precision=precision, scaler=scaler,
                            task=info.task, label_smoothing=tc.label_smoothing, channels_last=channels_last,
                            loss_fn=hooks.loss,
                        )
                        local_loss = loss_sum.item()
                    except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled, the rest re-raised
                        if not is_oom(exc):
                            raise
                        del exc
                        if strategy == "fsdp":  # other ranks may be inside an all-gather: restart the group smaller
                            request_oom_restart(run_dir, shrink_micro_batch(micro, accumulation)[0], step + 1)
                        oom, local_loss, wait_s = True, 0.0, 0.0
                    agreed = agree(env, device, local_loss, oom, bool(stop), wait_s)
                    if not agreed.oom:
                        break
                    optimizer.zero_grad(set_to_none=True)
                    empty_cache(device)
                    micro, accumulation = shrink_micro_batch(micro, accumulation)
                    progress.log(f"[yellow]out of memory at step {step + 1}: micro-batch -> {micro}, accumulation -> {accumulation}")
                    torch.set_rng_state(rng_at_step)
                    sampler.set_micro_batch_size(micro)
                    batches = batches_from(epoch, position)
                loss, wait_s = agreed.loss, agreed.data_wait_s
                if agreed.stop and not stop:
                    stop.signal_name = "SIGTERM (another rank)"

                # a non-finite loss skips the update; too many in a row ends the run (last checkpoint intact)
                if math.isfinite(loss):
                    bad_in_row = 0
                    if strategy == "ddp":
                        all_reduce_gradients(model, env)  # once per optimizer step, after the agreement
                    scaler.unscale_(optimizer)
                    grad_norm = grad_norm_and_clip(model, tc.grad_clip_norm, measure=(step + 1) % tc.log_every_steps == 0)
                    scaler.step(optimizer)
                    scaler.update()
                    if ema is not None:
                        ema.update(model)
                    window.add(loss, wait_s)
                else:
                    skipped, bad_in_row, grad_norm = skipped + 1, bad_in_row + 1, None
                    progress.log(f"[yellow]step {step + 1}: non-finite loss ({loss}), update skipped ({bad_in_row} in a row)")
                    if bad_in_row >= tc.max_bad_steps:
                        raise JobFailed(
                            f"{bad_in_row} non-finite losses in a row at step {step + 1}: the run diverged; lower optim.lr, "
                            f"use train.precision=fp32 or bf16, or lower train.grad_clip_norm. The last good "
                            f"checkpoint is kept in {run_dir / 'checkpoints'}"
                        )
                optimizer.zero_grad(set_to_none=True)
                done = step + 1

                # log a train row
                if done % tc.log_every_steps == 0 or done == total_steps:
                    row = window.row(device, global_batch)
                    row["peak_mem_bytes"] = int(max_over_ranks(env, device, row["peak_mem_bytes"]))
                    row.update(split="train", step=done, epoch=round(done / per_epoch, 4), lr=lr, grad_norm=grad_norm,
                               micro_batch_size=micro, accumulation=accumulation)
                    metrics.log(row)
                    progress.update(done, epoch, row["loss"], lr, row["samples_per_s"])
                    window = Window()

                # evaluate: val row, early stopping, best weights
                # evaluate (rank 0 of replicas; every rank under FSDP): val row, early stopping, best weights
                if (done % eval_every == 0 or done == total_steps) and (env.is_main or strategy == "fsdp"):
                    val = evaluate_now()
                    empty_cache(device)  # hand the evaluation's cached blocks back (CUDA): others share the GPU
                    metrics.log({"split": "val", "step": done, "epoch": round(done / per_epoch, 4), **val})
                    if stopper is not None:
                        if stopper.update(val, done):
                            source = ema.shadow if ema else model.state_dict()
                            best_state = {k: v.detach().to("cpu", copy=True) for k, v in source.items()}
                        if stopper.should_stop:
                            status = "early_stopped"
                            progress.log(f"early stopping at step {done}: no {stopper.metric} improvement "
                                         f"in {stopper.patience} evaluations (best {stopper.best:.4f})")
                    if hooks.on_eval is not None and hooks.on_eval(done, val):
                        status = "pruned"
                        progress.log(f"stopped at step {done}: the caller pruned this run")
                if done % eval_every == 0 or done == total_steps:
                    status = broadcast_object(env, status)

                # checkpoint when due (not amid a run of non-finite losses), at the end, on a signal, on early stop
                due = (done % ckpt_every == 0 or done == total_steps) and bad_in_row == 0
                if due or stop or status != "completed":
                    checkpoint(done)
                if stop:
                    status = "interrupted"
                    progress.log(f"{stop.signal_name}: checkpoint saved at step {done}; resume with --resume auto")
                if status != "completed":
                    break
            # ================================================================ end of the loop
        finally:
            progress.close()
            metrics.close()

        result = TrainResult(run_dir, status, done, val=val, skipped_steps=skipped, micro_batch_size=micro,
                             data=data_summary.counts)
        if status in ("interrupted", "pruned"):
            barrier(env)
            return result
        if strategy == "fsdp":  # gather the whole weights once; rank 0 evaluates a plain copy
            whole = full_model_state(model)
            if env.is_main:
                model = hooks.build_model(info) if hooks.build_model else build_model(cfg.model, info)[0]
                load_model_weights(model, whole)
                model.to(device)
        if not env.is_main:
            barrier(env)
            return result

        # ---- the final model: best (early stopping) > EMA > last weights; test metrics; report
        final_step, final_val = done, val
        if best_state:  # the weights are those of the best evaluation: so are the step and metrics recorded
            load_model_weights(model, best_state)
            final_step, final_val = stopper.best_step or done, stopper.best_metrics or val
        elif ema is not None:
            model.load_state_dict(ema.shadow, strict=False)
        ran = {"micro_batch_size": micro, "accumulation": accumulation, "world_size": env.world_size,
               "steps_trained": done}
        save_final_model(run_dir, model.state_dict(), cfg, info, data.preprocess, final_step, metrics=final_val, ran=ran)
        test_loader = make_eval_loader(data.test, batch_size=max(micro, 64), num_workers=0, pin_memory=pin)
        test = evaluate_model(model, test_loader, info=info, device=device, precision=precision, detailed=True)
        result.eval = {"split": "test", "step": final_step, **test}
        write_text_atomic(run_dir / "eval.json", json.dumps(result.eval, indent=1))
        write_report(run_dir)
        del model, optimizer, step_model
        empty_cache(device)  # the run is over: give its cached memory back before the caller goes on
        barrier(env)
        return result


def forward_backward(
    model: nn.Module,
    batches: Iterator,
    accumulation: int,
    *,
    device: torch.device,
    precision: str,
    scaler: torch.amp.GradScaler,
    task: str,
    label_smoothing: float,
    channels_last: bool,
    loss_fn: Optional[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = None,
) -> tuple[torch.Tensor, float]:
    """Accumulate gradients of the mean loss over `accumulation` micro-batches.

    Each micro-batch's loss is divided by `accumulation`, so the summed gradients equal those of one
    batch `accumulation` times larger (micro-batches are equal-sized). Returns (mean loss, data wait s).
    """
    total = torch.zeros((), device=device)
    wait_s = 0.0
    sharded = hasattr(model, "set_requires_gradient_sync")  # FSDP: reduce-scatter only after the last
    for i in range(accumulation):
        if sharded:
            model.set_requires_gradient_sync(i == accumulation - 1)
        t0 = time.perf_counter()
        x, y = next(batches)
        wait_s += time.perf_counter() - t0
        if channels_last and x.dim() == 4:
            x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
        else:
            x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with autocast(device, precision):
            logits = model(x)
        if loss_fn is not None:
            loss = loss_fn(logits.float(), x, y) / accumulation
        else:
            loss = task_loss(logits.float(), y, task, label_smoothing=label_smoothing) / accumulation
        scaler.scale(loss).backward()
        total += loss.detach()
    return total, wait_s


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
