"""One run from config to result: join the process group, build the data and the model, resolve the setup,
fit it. `trainforge.train()` calls it after choosing the run directory and the checkpoint to resume;
calibration and the benchmarks call it directly.

    result = run(cfg, Path("runs/mine"))                              # a fresh run
    result = run(cfg, run_dir, resume_from=run_dir / "checkpoints/step-000120")
    result.setup      # the RunSetup it ran (training.setup), with the reason for every value
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from trainforge.config import Config
from trainforge.data.base import DataBundle
from trainforge.data.summary import summarize
from trainforge.engine.checkpoint import load_state
from trainforge.engine.data_parallel import broadcast_object, min_over_ranks
from trainforge.engine.env import DistEnv, distributed
from trainforge.engine.microbatch import clear_oom_restart, read_oom_restart
from trainforge.engine.preflight import preflight
from trainforge.engine.progress import announce_data, console
from trainforge.engine.rng import determinism, seed_everything
from trainforge.engine.signals import stop_on_signals
from trainforge.files import write_text_atomic
from trainforge.layout import CONFIG, DATA_REPORT, SAMPLES
from trainforge.models import build_model
from trainforge.models.lora import check_base
from trainforge.planning.auto import MemoryBudget, device_budget
from trainforge.training.generate import answer_prompts, val_prompts
from trainforge.training.loop import FitHooks, RunInputs, TrainResult, fit
from trainforge.training.setup import OOMNote, resolve
from trainforge.tasks import task_of


def run(cfg: Config, run_dir: Path, resume_from: Optional[Path] = None, hooks: Optional[FitHooks] = None) -> TrainResult:
    hooks = hooks or FitHooks()
    tc, run_dir = cfg.train, Path(run_dir)
    if hooks.observer is not None:  # e.g. MLflow, an optional extra: said before any work
        hooks.observer.check(cfg)
    with contextlib.ExitStack() as stack:
        env, device = stack.enter_context(distributed(tc.device))
        stack.enter_context(determinism(tc.deterministic, tc.num_threads, device))
        stop = stack.enter_context(stop_on_signals())
        seed_everything(cfg.seed)  # the same initial weights on every rank (rank 0's are broadcast too)

        saved = load_state(resume_from) if resume_from is not None else None  # verified here, once
        stored = json.loads(saved["preprocess_json"]) if saved is not None else None  # resume: its tokenizer
        pre = preflight(cfg, world_size=env.world_size, stored=stored, model_factory=hooks.build_model)
        data, model, facts, frozen, total = pre.data, pre.model, pre.facts, pre.frozen_params, pre.total_params
        if saved is not None:  # adapters continue only on the base they were trained on
            check_base(json.loads(saved.get("base_json") or "null"), model, str(resume_from))
        setup = resolve(cfg, env, device, facts, checkpoint=saved, oom=take_oom_note(run_dir, env),
                        budget=agreed_budget(cfg, env, device))

        # the run directory is created only once data, model and setup are known to be good; rank 0 writes.
        # What cleaning dropped is said on the console then (bad input stays one line), not only in data_report.json
        summary = summarize(data.report)
        if env.is_main:
            announce_data(summary)
            if frozen:
                console.print(f"train.freeze: {frozen:,} of {total:,} parameters frozen ({frozen / total:.1%}); "
                              f"{total - frozen:,} trained", highlight=False, soft_wrap=True)
            run_dir.mkdir(parents=True, exist_ok=True)
            write_text_atomic(run_dir / CONFIG, cfg.to_yaml())
            write_text_atomic(run_dir / DATA_REPORT, json.dumps(data.report, indent=1))
        inputs = RunInputs(
            cfg, run_dir, data, model, facts, stop, resume_from=resume_from, data_counts=summary.counts,
            reresolve=lambda oom: resolve(cfg, env, device, facts, oom=oom),
            rebuild_model=hooks.build_model or (lambda info: build_model(cfg.model, info)[0]),
            eval_samples=chat_samples(cfg, data, run_dir, device) if env.is_main else None)
        # rank 0's observer (the caller's: tracking mirrors the run directory into MLflow from a thread); the loop
        # knows nothing of it
        watching = hooks.observer is not None and env.is_main
        following = stack.enter_context(hooks.observer.follow(run_dir, cfg)) if watching else None
        result = fit(setup, inputs, hooks)
        if following is not None:
            following.finish(result.status)
        return result


def chat_samples(cfg: Config, data: DataBundle, run_dir: Path, device: torch.device
                 ) -> Optional[Callable[[nn.Module, int], None]]:
    """For a chat run of an hf causal LM: at each evaluation, greedy answers to the first validation conversations'
    prompts, appended to samples.jsonl (the report shows them); None for any other run. The loop calls it as the
    run's extra at each evaluation, and knows nothing of chat or of generation."""
    pre = data.preprocess
    if not pre.get("chat_template") or cfg.model.name != "hf" or not task_of(data.info).generates:
        return None
    prompts = val_prompts(data.val)

    def write(model: nn.Module, step: int) -> None:
        rows = answer_prompts(model, pre, prompts, device=device)
        with (run_dir / SAMPLES).open("a", encoding="utf-8") as f:
            f.writelines(json.dumps({"step": step, **row}) + "\n" for row in rows)
    return write if prompts else None


def take_oom_note(run_dir: Path, env: DistEnv) -> Optional[OOMNote]:
    """The out-of-memory restart request a failed group left (rank 0 reads it and every rank gets it), consumed:
    the file is deleted once read, so a later resume is not held to it."""
    note = read_oom_restart(run_dir) if env.is_main else None
    note = broadcast_object(env, note)
    if env.is_main and note is not None:
        clear_oom_restart(run_dir)
    return OOMNote(note[0], note[1], restarted=True) if note is not None else None


def agreed_budget(cfg: Config, env: DistEnv, device) -> Optional[MemoryBudget]:
    """`micro_batch_size: auto` on many processes: the smallest budget of any rank, so all pick the same size."""
    if cfg.train.micro_batch_size != "auto" or not env.is_distributed:
        return None
    own = device_budget(cfg.train.memory_budget_bytes, device)
    return replace(own, budget_bytes=int(min_over_ranks(env, device, own.budget_bytes)),
                   source=f"{own.source}, the smallest of {env.world_size} processes")
