"""Fine-tuning: trainforge's `train()` against `transformers.Trainer` on the same tiny BERT, data and settings.

    .venv/bin/python benchmarks/finetune_vs_hf.py                 # table + ratio, about 1.5 minutes on 2 vCPUs
    .venv/bin/python benchmarks/finetune_vs_hf.py --json          # one JSON document with a top-level "ratio"

Both sides fine-tune one "pretrained" BertForSequenceClassification (2 layers, hidden 64, 2 heads, vocabulary
257, dropout 0.1; built from a config with random weights and written by `save_pretrained` into a temporary
directory, which both load: nothing is downloaded, HF_HUB_OFFLINE=1) on a generated JSONL of short texts with
2 labels. trainforge runs as users run it: `trainforge.train(cfg, run_dir=...)` (what `trainforge train` calls)
with `model.name: hf`, `data.source: jsonl` and its default byte tokenizer (id = UTF-8 byte + 1, padding 0,
`--seq-len` ids). The Trainer gets the same token ids, tokenized here from the same file with that rule
(checked equal to trainforge's tensors), with `attention_mask = ids != 0`, as trainforge's hf wrapper builds it,
from a plain torch Dataset of those tensors (the fastest input path a Trainer user has).

Same settings on both sides: batch size, fp32 on the CPU, the same torch thread count, torch's AdamW (same lr,
betas, eps; `optim="adamw_torch"`, the implementation trainforge runs on the CPU: it uses the fused kernel only
on accelerators, while the Trainer's own default on torch >= 2.8 is `adamw_torch_fused`, see `--hf-optim`) with
weight decay on the same parameters (trainforge leaves embeddings, LayerNorm and biases undecayed; the
Trainer's default rule would also decay the three embedding tables, so it is handed trainforge's list through
its `get_decay_parameter_names`), gradient clipping at 1.0, cosine decay to 0 over the run. The cosine formulas
agree exactly without warmup; with `--warmup-steps W` they differ during warmup only (trainforge's step k uses
lr (k+1)/W, transformers' k/W: its first update is at lr 0), which then shows in the loss difference. No
evaluation, checkpoint, progress bar or TensorBoard during the timed steps (trainforge evaluates, checkpoints
and writes its final model after the last step; the Trainer saves nothing). Both log the loss every 10 steps
(trainforge's metrics.jsonl row, the Trainer's log_history; its console printer is removed so stdout stays one
JSON document). DataLoader workers: 0 on both sides (trainforge's default on the CPU; workers would compete
with the compute threads of a small box).

Same batches in the same order: the Trainer's sampler yields the JSONL rows in trainforge's order (its train
split, permuted by `epoch_order(seed, 0)`); all steps fit in one epoch. Same dropout masks: at its first
training forward the Trainer's global torch RNG is set to the state trainforge's had at its own first forward;
neither side draws from that RNG between forwards. Same initial weights: compared at the first forward.

Timing, identical on both sides: a forward pre-hook on the transformers model itself (the module trainforge
wraps and the Trainer trains) reads two clocks at the start of every training forward; a step is the time from
one forward's start to the next one's (data, forward, backward, clipping, optimizer, logging, the loop's own
work). `cpu` is this process's CPU time (`time.process_time`), which other jobs on a shared box do not inflate
and which with 1 compute thread equals the wall time of a quiet machine; `wall` is `perf_counter`. `--clock`
picks the headline (default cpu); both are reported. The first `--skip` steps of every run are warm-up.
Interleaving (`--interleave step`, default): each repeat runs the two trainings in lockstep, trainforge in the
main thread and the Trainer in a second one, taking one step each in turn (the waiting side is blocked, outside
its clocks, and keeps its own RNG stream), so step k of one is timed right next to step k of the other; the
repeats alternate which side steps first. `--interleave run` runs whole trainings one after the other instead.
Printed: ratio = median trainforge step / median Trainer step (goal <= 1.0), both medians, the median of the
paired per-step ratios, and the largest absolute difference between the two per-step loss curves
(cross-entropy of each step's logits; trainforge's checked against its metrics rows, the Trainer's against
the loss its model returned). Always exits 0: the ratio is a measurement, not a test.
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: nothing is ever downloaded
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import argparse
import contextlib
import datetime
import json
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Sampler

import transformers
from transformers import (BertConfig, BertForSequenceClassification, PrinterCallback, Trainer, TrainingArguments,
                          default_data_collator)
from transformers.optimization import get_cosine_schedule_with_warmup

sys.path.insert(0, str(Path(__file__).resolve().parent))  # lockstep: shared with the other side-by-side benchmarks

import trainforge
from lockstep import Baton, lockstep, relative_iqr  # noqa: E402
from trainforge.config import Config, config_from_dict
from trainforge.data import build_data
from trainforge.data.stages.loader import epoch_order
from trainforge.hardware.cpus import available_cpus
from trainforge.engine.metrics import read_metrics
from trainforge.engine.optim import param_groups
from trainforge.engine.schedule import lr_at

GOAL_RATIO = 1.0
# cpu: this process's CPU time (all its threads). On a shared machine it counts only the time the process ran,
# which wall time does not; with 1 compute thread and no I/O to wait for, it is the wall time of a quiet machine
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
LOG_EVERY_STEPS = 10  # trainforge's train.log_every_steps = Trainer's logging_steps
NOISY_SPREAD = 0.10
VAL_FRACTION = TEST_FRACTION = 0.02  # trainforge evaluates and tests once, after the timed steps
MODEL = dict(vocab_size=257, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
             max_position_embeddings=128)  # BERT's default dropout 0.1 stays
LABELS = ("negative", "positive")
GOOD = "good great fine superb lovely nice brilliant solid".split()
BAD = "bad poor awful dull weak broken boring sloppy".split()
FILLER = ("the a this that film book meal room plot cast staff view price service sound story screen was is "
          "quite very rather and but so really").split()


# ---------------------------------------------------------------- inputs shared by both sides


def make_records(num_samples: int, seq_len: int, seed: int) -> list[dict[str, str]]:
    """Short reviews, distinct in their first `seq_len` bytes (trainforge drops duplicate samples); the label is
    the majority of the review's 1 or 3 sentiment words (learnable, not trivial)."""
    rng = random.Random(seed)
    seen: set[bytes] = set()
    records = []
    for _ in range(50 * num_samples):
        marks = [rng.random() < 0.5 for _ in range(rng.choice((1, 3)))]
        words = [rng.choice(GOOD if m else BAD) for m in marks] + rng.choices(FILLER, k=rng.randint(4, 10))
        rng.shuffle(words)
        text = " ".join(words)
        if text.encode("utf-8")[:seq_len] in seen:
            continue
        seen.add(text.encode("utf-8")[:seq_len])
        records.append({"text": text, "label": LABELS[sum(marks) * 2 > len(marks)]})
        if len(records) == num_samples:
            return records
    raise SystemExit(f"--seq-len {seq_len} is too short for {num_samples} distinct samples; raise it or lower "
                     "--steps / --batch-size")


def byte_ids(text: str, seq_len: int) -> list[int]:
    """trainforge's default `jsonl` tokenizer, written out here: UTF-8 byte + 1, cut or right-padded with 0."""
    ids = [b + 1 for b in text.encode("utf-8")[:seq_len]]
    return ids + [0] * (seq_len - len(ids))


def save_pretrained_bert(directory: Path, seed: int) -> None:
    torch.manual_seed(seed)
    BertForSequenceClassification(BertConfig(**MODEL, num_labels=len(LABELS))).save_pretrained(str(directory))


def bench_config(*, jsonl: Path, bert_dir: Path, steps: int, batch_size: int, seq_len: int, threads: int,
                 seed: int, lr: float, weight_decay: float, warmup_steps: int) -> Config:
    data = {"source": "jsonl", "path": str(jsonl), "args": {"seq_len": seq_len}}
    return run_config("finetune_vs_hf", data=data, model={"name": "hf", "args": {"pretrained": str(bert_dir)}},
                      steps=steps, batch_size=batch_size, threads=threads, seed=seed, lr=lr,
                      weight_decay=weight_decay, warmup_steps=warmup_steps, device="cpu")


def run_config(name: str, *, data: dict[str, Any], model: dict[str, Any], steps: int, batch_size: int,
               threads: int, seed: int, lr: float, weight_decay: float, warmup_steps: int, device: str) -> Config:
    """trainforge's config for a benchmark run (`data` and `model` its own): the settings the Trainer is given
    too (`trainer_args`), evaluation and the checkpoint only after the last step, no progress bar."""
    return config_from_dict({
        "name": name,
        "seed": seed,
        "data": {**data, "val_fraction": VAL_FRACTION, "test_fraction": TEST_FRACTION, "num_workers": 0},
        "model": model,
        "optim": {"name": "adamw", "lr": lr, "weight_decay": weight_decay, "betas": [0.9, 0.999], "eps": 1e-8},
        "schedule": {"name": "cosine", "warmup_steps": warmup_steps, "min_lr_ratio": 0.0},
        "train": {
            "max_steps": steps, "global_batch_size": batch_size, "micro_batch_size": batch_size,
            "precision": "fp32", "device": device, "compile": False, "grad_clip_norm": 1.0, "label_smoothing": 0.0,
            "ema_decay": None, "early_stopping": None, "eval_every_steps": steps, "checkpoint_every_steps": steps,
            "keep_checkpoints": 1, "log_every_steps": LOG_EVERY_STEPS, "num_threads": threads,
        },
        "log": {"progress": False, "tensorboard": False},
    })


class Inputs:
    """Everything both sides train on, checked to be the same thing."""

    def __init__(self, cfg: Config, records: list[dict[str, str]], steps: int, batch_size: int) -> None:
        bundle = build_data(cfg.data, seed=cfg.seed)  # trainforge's own split, as train() will build it
        names = list(bundle.info.class_names)
        seq_len = cfg.data.args["seq_len"]
        self.ids = torch.tensor([byte_ids(r["text"], seq_len) for r in records], dtype=torch.int64)
        self.labels = torch.tensor([names.index(r["label"]) for r in records], dtype=torch.int64)
        rows = torch.as_tensor(bundle.train.indices)  # train position -> line of the JSONL (nothing was dropped)
        assert len(bundle.train) >= steps * batch_size, "bench sizes the data so that a run fits in one epoch"
        assert bundle.report["rows_kept"] == len(records), bundle.report["dropped"]
        tf_x, tf_y = bundle.train.samples.x, bundle.train.samples.y
        assert torch.equal(tf_x[rows], self.ids[rows]) and torch.equal(tf_y[rows], self.labels[rows]), \
            "the byte tokenization here differs from trainforge's jsonl source"
        # the rows trainforge's steps take, in its order: epoch 0's permutation of the train split, dropping the rest
        self.order = rows[epoch_order(len(bundle.train), cfg.seed, 0)[: steps * batch_size]].tolist()
        self.batch_size, self.class_names = batch_size, names

    def step_labels(self, step: int) -> torch.Tensor:
        return self.labels[self.order[step * self.batch_size: (step + 1) * self.batch_size]]


# ---------------------------------------------------------------- the one instrument, on both sides

SIDES = ("trainforge", "hf")


def other(side: str) -> str:
    return SIDES[1 - SIDES.index(side)]


class StepProbe:
    """Hooks on the transformers model itself, attached at its first training forward.

    A global forward pre-hook (for this thread only) finds the `model_class` module (here the
    BertForSequenceClassification, inside trainforge's HFModel or the Trainer's model), then removes itself; from
    there one pre-hook reads both clocks at the start of each training forward (the end of the previous step,
    then, after the other side's step when there is a baton, the start of this one) and one forward hook keeps the
    logits. At the first forward the
    probe records the global RNG state and the initial weights and, given `rng_state`, replaces the RNG state:
    both sides draw the same dropout masks. With a baton each side keeps its own RNG stream across turns."""

    model_class: type = BertForSequenceClassification  # the module whose training forwards delimit the steps

    def __init__(self, side: str, *, rng_state: Optional[torch.Tensor] = None, keep_weights: bool = False,
                 baton: Optional[Baton] = None) -> None:
        self.side, self.rng_state, self.keep_weights, self.baton = side, rng_state, keep_weights, baton
        self.starts: dict[str, list[float]] = {clock: [] for clock in CLOCKS}
        self.ends: dict[str, list[float]] = {clock: [] for clock in CLOCKS}
        self.logits: list[torch.Tensor] = []
        self.model_losses: list[float] = []  # what the model returned, when it computed a loss (the Trainer)
        self.first_rng: Optional[torch.Tensor] = None
        self.initial: Optional[dict[str, torch.Tensor]] = None
        self._handles: list[Any] = []

    def __enter__(self) -> "StepProbe":
        self._thread = threading.get_ident()
        self._finder = torch.nn.modules.module.register_module_forward_pre_hook(self._find)
        return self

    def __exit__(self, *exc: object) -> None:
        self._finder.remove()
        for h in self._handles:
            h.remove()

    def _stamp(self, into: dict[str, list[float]]) -> None:
        for clock, read in CLOCKS.items():
            into[clock].append(read())

    def _find(self, module: torch.nn.Module, args: tuple) -> None:
        if not (isinstance(module, self.model_class) and module.training and threading.get_ident() == self._thread):
            return
        self._finder.remove()
        self.first_rng = torch.get_rng_state()
        own = self.rng_state if self.rng_state is not None else self.first_rng
        if self.keep_weights:
            self.initial = {k: v.detach().clone() for k, v in module.state_dict().items()}
        if self.baton is not None:
            self.baton.arrive(self.side)
        torch.set_rng_state(own)
        # plain functions, not bound methods: trainforge deep-copies a LoRA model to merge the adapters when it
        # saves final/hf, and a copied bound method would copy this probe (and its baton's lock)
        self._handles += [module.register_forward_pre_hook(lambda m, a: self._start(m, a)),
                          module.register_forward_hook(lambda m, a, o: self._end(m, a, o))]
        self._attached(module)
        # this call's hooks were collected before ours were added: this forward's start is stamped here
        self._stamp(self.starts)

    def _attached(self, module: torch.nn.Module) -> None:
        """At the first training forward, after the wait for the other side and before the first stamp."""

    def _start(self, module: torch.nn.Module, args: tuple) -> None:
        if not module.training:
            return
        self._stamp(self.ends)
        if self.baton is not None:
            own = torch.get_rng_state()
            self.baton.hand_over(self.side)
            torch.set_rng_state(own)
        self._stamp(self.starts)

    def _end(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if module.training:
            self.logits.append(output.logits.detach())
            if output.loss is not None:
                self.model_losses.append(float(output.loss.detach()))

    def step_times(self, clock: str, skip: int) -> list[float]:
        """Seconds of each step but the last (it has no next forward to end it), the first `skip` dropped."""
        return [e - s for s, e in zip(self.starts[clock], self.ends[clock])][skip:]


def step_losses(probe: StepProbe, inputs: Inputs) -> list[float]:
    return [float(F.cross_entropy(logits.float(), inputs.step_labels(k))) for k, logits in enumerate(probe.logits)]


# ---------------------------------------------------------------- the two sides


def run_trainforge(cfg: Config, inputs: Any, probe: StepProbe, *,
                   losses_of: Callable[[Any, Any], list[float]] = step_losses,
                   prefix: str = "finetune-tf-") -> dict[str, Any]:
    """trainforge.train() in a throwaway run dir, unmodified; the probe watches its model. `losses_of(probe,
    inputs)`: the per-step losses from the logits the probe kept (none kept: no losses, nothing checked)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, probe:
        t0 = time.perf_counter()
        result = trainforge.train(cfg, run_dir=Path(tmp) / "run")
        wall_s = time.perf_counter() - t0
        rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["split"] == "train"]
    steps = cfg.train.max_steps
    assert result.steps == steps and len(probe.starts["wall"]) == steps, (result.steps, len(probe.starts["wall"]))
    losses = losses_of(probe, inputs)
    # the per-step losses rebuilt here are trainforge's own: its metrics rows are their means
    for row in rows if losses else []:
        window = losses[(row["step"] - 1) // LOG_EVERY_STEPS * LOG_EVERY_STEPS: row["step"]]
        assert abs(statistics.fmean(window) - row["loss"]) <= 1e-5 * max(1.0, abs(row["loss"])), (row, window)
    return {"probe": probe, "losses": losses, "wall_s": wall_s,
            "metrics_step_s": [r["step_time_s"] for r in rows[1:]]}


class TokenIds(Dataset):
    """The byte token ids as a Trainer dataset: input_ids, attention_mask (ids != 0), labels."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor) -> None:
        self.ids, self.mask, self.labels = ids, (ids != 0).long(), labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class FixedOrder(Sampler[int]):
    def __init__(self, order: list[int]) -> None:
        self.order = order

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self):
        return iter(self.order)


class SameOrderTrainer(Trainer):
    """transformers.Trainer with trainforge's sample order and trainforge's weight-decay parameter list."""

    def __init__(self, *args: Any, order: list[int], decay_names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order, self.decay_names = order, decay_names

    def _get_train_sampler(self, train_dataset: Optional[Dataset] = None) -> Sampler:
        return FixedOrder(self.order)

    def get_decay_parameter_names(self, model: torch.nn.Module) -> list[str]:
        return list(self.decay_names)


def trainforge_decay_names(model: torch.nn.Module, cfg: Config) -> list[str]:
    """The parameters trainforge's optimizer applies weight decay to (by its own rule)."""
    decayed = {id(p) for g in param_groups(model, cfg.optim) if g["weight_decay"] > 0 for p in g["params"]}
    return [n for n, p in model.named_parameters() if id(p) in decayed]


def trainer_args(cfg: Config, output_dir: str, hf_optim: str, **extra: Any) -> TrainingArguments:
    """The Trainer's side of the settings both sides share (see the docstring); nothing evaluated or saved."""
    tc, oc = cfg.train, cfg.optim
    return TrainingArguments(
        output_dir=output_dir, max_steps=tc.max_steps, per_device_train_batch_size=tc.global_batch_size,
        learning_rate=oc.lr, weight_decay=oc.weight_decay, adam_beta1=oc.betas[0], adam_beta2=oc.betas[1],
        adam_epsilon=oc.eps, optim=hf_optim, lr_scheduler_type="cosine",
        warmup_steps=cfg.schedule.warmup_steps, max_grad_norm=tc.grad_clip_norm, use_cpu=tc.device == "cpu",
        seed=cfg.seed, dataloader_num_workers=0, dataloader_pin_memory=False, dataloader_drop_last=True,
        eval_strategy="no", save_strategy="no", logging_strategy="steps", logging_steps=LOG_EVERY_STEPS,
        report_to="none", disable_tqdm=True, **extra,
    )


def train_hf(trainer: Trainer, probe: StepProbe, t0: float) -> tuple[float, list[dict[str, Any]]]:
    """`trainer.train()` under the probe: wall seconds since `t0` (the side's setup included) and the optimizer's
    parameter groups (size, weight decay)."""
    trainer.remove_callback(PrinterCallback)  # it prints each log dict to stdout
    with probe:
        trainer.train()
    wall_s = time.perf_counter() - t0
    steps = trainer.args.max_steps
    assert trainer.state.global_step == steps and len(probe.starts["wall"]) == steps, \
        (trainer.state.global_step, len(probe.starts["wall"]))
    return wall_s, [{"n": len(g["params"]), "wd": g["weight_decay"]} for g in trainer.optimizer.param_groups]


def run_hf(cfg: Config, inputs: Inputs, bert_dir: Path, probe: StepProbe, hf_optim: str = "adamw_torch") -> dict[str, Any]:
    """transformers.Trainer.train() on the same model directory, data order and settings."""
    # torch's thread count: set for both sides by `measure` (trainforge's train.num_threads sets the same)
    with tempfile.TemporaryDirectory(prefix="finetune-hf-") as tmp:
        t0 = time.perf_counter()
        model = BertForSequenceClassification.from_pretrained(str(bert_dir))
        trainer = SameOrderTrainer(model=model, args=trainer_args(cfg, tmp, hf_optim),
                                   train_dataset=TokenIds(inputs.ids, inputs.labels),
                                   data_collator=default_data_collator, order=inputs.order,
                                   decay_names=trainforge_decay_names(model, cfg))
        wall_s, groups = train_hf(trainer, probe, t0)
    losses = step_losses(probe, inputs)
    # the labels the Trainer trained on are the ones assumed here: its model's own losses match
    assert max(abs(a - b) for a, b in zip(losses, probe.model_losses)) <= 1e-5, "the Trainer saw another order"
    return {"probe": probe, "losses": losses, "wall_s": wall_s, "groups": groups}


def run_pair(cfg: Config, inputs: Inputs, bert_dir: Path, *, first: str, interleave: str,
             tf_rng: Optional[torch.Tensor], keep_weights: bool, hf_optim: str) -> dict[str, dict[str, Any]]:
    """One repeat: a trainforge run and a Trainer run, in lockstep (`step`) or one after the other (`run`, the
    Trainer then takes the RNG state of an earlier trainforge run: `tf_rng`)."""
    if interleave == "run":
        out: dict[str, dict[str, Any]] = {}
        for side in (first, other(first)):
            if side == "trainforge":
                out[side] = run_trainforge(cfg, inputs, StepProbe(side, keep_weights=keep_weights))
                tf_rng = out[side]["probe"].first_rng
            else:
                assert tf_rng is not None, "a Trainer run needs the RNG state of a trainforge run"
                out[side] = run_hf(cfg, inputs, bert_dir, StepProbe(side, rng_state=tf_rng, keep_weights=keep_weights),
                                   hf_optim)
        return out
    baton = Baton(first, SIDES)
    tf_probe = StepProbe("trainforge", keep_weights=keep_weights, baton=baton)
    tf, hf = lockstep(baton, lambda: run_trainforge(cfg, inputs, tf_probe),
                      lambda: run_hf(cfg, inputs, bert_dir, StepProbe("hf", rng_state=tf_probe.first_rng,
                                                                     keep_weights=keep_weights, baton=baton), hf_optim))
    return {"trainforge": tf, "hf": hf}


# ---------------------------------------------------------------- measure and report


def lr_check(cfg: Config) -> float:
    """Largest |trainforge lr - transformers lr| over the run's steps (0 when the formulas agree)."""
    steps, sc = cfg.train.max_steps, cfg.schedule
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.optim.lr)
    sched = get_cosine_schedule_with_warmup(opt, sc.warmup_steps, steps)
    diff = 0.0
    for k in range(steps):  # update k runs at the lr set before it; the Trainer steps its scheduler after it
        diff = max(diff, abs(lr_at(k, base_lr=cfg.optim.lr, total_steps=steps, cfg=sc) - opt.param_groups[0]["lr"]))
        opt.step()
        sched.step()
    return diff


class Repeats:
    """The repeats' step times pooled per clock and side, one row per repeat, the loss curves compared."""

    def __init__(self, skip: int, of: int) -> None:
        self.skip, self.of = skip, of
        self.pooled: dict[str, dict[str, list[float]]] = {c: {side: [] for side in SIDES} for c in CLOCKS}
        self.paired: dict[str, list[float]] = {c: [] for c in CLOCKS}
        self.rows: list[dict[str, Any]] = []
        self.max_loss_diff = 0.0
        self.curves: dict[str, list[float]] = {}  # the last repeat's

    def add(self, out: dict[str, dict[str, Any]], *, first: str, t0: float, **extra: Any) -> None:
        """One repeat's pair (`run_pair`'s `out`), begun at perf_counter `t0`; `extra` joins its row."""
        times = {side: {c: out[side]["probe"].step_times(c, self.skip) for c in CLOCKS} for side in SIDES}
        for c in CLOCKS:
            for side in SIDES:
                self.pooled[c][side] += times[side][c]
            # in lockstep, step k of one side ran right next to step k of the other: compare them in pairs too
            self.paired[c] += [a / b for a, b in zip(times["trainforge"][c], times["hf"][c])]
        tf, hf = out["trainforge"], out["hf"]
        diff = max(abs(a - b) for a, b in zip(tf["losses"], hf["losses"]))
        self.max_loss_diff = max(self.max_loss_diff, diff)
        self.curves = {"trainforge": tf["losses"], "hf": hf["losses"]}
        row = {
            "repeat": len(self.rows) + 1, "first": first,
            **{f"{c}_{side}_median_step_s": statistics.median(times[side][c]) for c in CLOCKS for side in SIDES},
            **{f"{c}_ratio": statistics.median(times["trainforge"][c]) / statistics.median(times["hf"][c])
               for c in CLOCKS},
            "max_loss_diff": diff, **extra, "trainforge_wall_s": tf["wall_s"], "hf_wall_s": hf["wall_s"],
        }
        self.rows.append(row)
        log(f"repeat {row['repeat']}/{self.of} ({first} first, {time.perf_counter() - t0:.1f} s): median step "
            + "; ".join(f"{c} trainforge {row[f'{c}_trainforge_median_step_s'] * 1e3:.2f} ms, Trainer "
                        f"{row[f'{c}_hf_median_step_s'] * 1e3:.2f} ms, ratio {row[f'{c}_ratio']:.3f}"
                        for c in CLOCKS)
            + f"; max loss diff {diff:.1e}")

    def by_clock(self, lockstep: bool) -> dict[str, dict[str, Any]]:
        by_clock = {}
        for c, sides in self.pooled.items():
            medians = {side: statistics.median(t) for side, t in sides.items()}
            spread = {side: relative_iqr(t) for side, t in sides.items()}
            by_clock[c] = {"ratio": medians["trainforge"] / medians["hf"], "step_s": medians,
                           "relative_iqr": spread, "noisy": max(spread.values()) > NOISY_SPREAD,
                           # median of trainforge step k / Trainer step k (lockstep: neighbours in time)
                           "paired_median_ratio": statistics.median(self.paired[c]) if lockstep else None}
        return by_clock

    def loss_summary(self, steps: int) -> dict[str, Any]:
        """The last repeat's curves: first step, mean of the last ones."""
        tail = max(1, min(LOG_EVERY_STEPS, steps // 4))
        curves = self.curves
        return {"trainforge_first": curves["trainforge"][0], "hf_first": curves["hf"][0],
                "trainforge_last_mean": statistics.fmean(curves["trainforge"][-tail:]),
                "hf_last_mean": statistics.fmean(curves["hf"][-tail:]), "last_steps_averaged": tail}


def machine(load_before: tuple[float, float, float], **versions: str) -> dict[str, Any]:
    """The result's "machine" block; `versions`: more libraries', listed after transformers."""
    return {
        "cpus": available_cpus(), "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, **versions, "trainforge": trainforge.__version__,
        "load_average_before": [round(v, 2) for v in load_before],
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
    }


def measure(*, repeats: int, steps: int, skip: int, batch_size: int, seq_len: int, threads: int, seed: int,
            lr: float, weight_decay: float, warmup_steps: int, clock: str = "cpu", interleave: str = "step",
            hf_optim: str = "adamw_torch", profile: int = 0) -> dict[str, Any]:
    load_before = os.getloadavg()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # the Trainer's; trainforge's train.num_threads sets the same for its run
    try:
        return _measure(repeats=repeats, steps=steps, skip=skip, batch_size=batch_size, seq_len=seq_len,
                        threads=threads, seed=seed, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps,
                        clock=clock, interleave=interleave, hf_optim=hf_optim, profile=profile,
                        load_before=load_before)
    finally:
        torch.set_num_threads(previous_threads)


def _measure(*, repeats: int, steps: int, skip: int, batch_size: int, seq_len: int, threads: int, seed: int,
             lr: float, weight_decay: float, warmup_steps: int, clock: str, interleave: str, hf_optim: str,
             profile: int, load_before: tuple[float, float, float]) -> dict[str, Any]:
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Loading weights" bars, on both sides
    with tempfile.TemporaryDirectory(prefix="finetune-vs-hf-") as tmp:
        train_fraction = 1 - VAL_FRACTION - TEST_FRACTION
        num_samples = int(steps * batch_size / train_fraction) + 4 * batch_size  # margin for split rounding
        records = make_records(num_samples, seq_len, seed)
        jsonl, bert_dir = Path(tmp) / "reviews.jsonl", Path(tmp) / "bert"
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        save_pretrained_bert(bert_dir, seed)
        cfg = bench_config(jsonl=jsonl, bert_dir=bert_dir, steps=steps, batch_size=batch_size, seq_len=seq_len,
                           threads=threads, seed=seed, lr=lr, weight_decay=weight_decay, warmup_steps=warmup_steps)
        inputs = Inputs(cfg, records, steps, batch_size)
        probe_model = BertForSequenceClassification.from_pretrained(str(bert_dir))
        decay_names = trainforge_decay_names(probe_model, cfg)
        hf_default_decay = Trainer.get_decay_parameter_names(None, probe_model)
        num_params = sum(p.numel() for p in probe_model.parameters())
        del probe_model

        tf_rng: Optional[torch.Tensor] = None
        initial: dict[str, dict[str, torch.Tensor]] = {}
        tally = Repeats(skip, repeats)
        for r in range(repeats):
            first = SIDES[r % 2]  # in `run` mode trainforge goes first in repeat 1: the Trainer needs its RNG state
            t0 = time.perf_counter()
            out = run_pair(cfg, inputs, bert_dir, first=first, interleave=interleave, tf_rng=tf_rng,
                           keep_weights=r == 0, hf_optim=hf_optim)
            first_rng = out["trainforge"]["probe"].first_rng
            assert tf_rng is None or torch.equal(first_rng, tf_rng), "trainforge's RNG at its first step changed"
            tf_rng = first_rng
            if r == 0:
                initial = {side: out[side]["probe"].initial for side in SIDES}
            metrics_step_s = out["trainforge"]["metrics_step_s"]
            # trainforge's own metrics rows time its steps as this probe's wall clock does (not in lockstep, where
            # its windows also hold the Trainer's steps)
            tally.add(out, first=first, t0=t0, trainforge_metrics_median_step_s=statistics.median(metrics_step_s)
                      if interleave == "run" and metrics_step_s else None)
        tf_initial, hf_initial = initial["trainforge"], initial["hf"]
        same_init = tf_initial.keys() == hf_initial.keys() and all(
            torch.equal(tf_initial[k], hf_initial[k]) for k in tf_initial)
        hf_groups = out["hf"]["groups"]
        if profile:
            profile_sides(cfg, inputs, bert_dir, tf_rng, profile, hf_optim)

    by_clock = tally.by_clock(lockstep=interleave == "step")
    headline = by_clock[clock]
    return {
        "benchmark": "finetune_vs_hf",
        "ratio": headline["ratio"],
        "clock": clock,
        "interleave": interleave,
        "goal_ratio": GOAL_RATIO,
        "meets_goal": headline["ratio"] <= GOAL_RATIO,
        "step_s": headline["step_s"],
        "max_loss_diff": tally.max_loss_diff,
        "steps": steps,
        "timed_steps_per_side": len(tally.pooled[clock]["trainforge"]),
        "relative_iqr": headline["relative_iqr"],
        "noisy": headline["noisy"],
        "by_clock": by_clock,
        "loss": tally.loss_summary(steps),
        "checks": {
            "same_initial_weights": same_init,
            "lr_schedule_max_abs_diff": lr_check(cfg),
            "decayed_parameters": len(decay_names),
            "hf_default_would_also_decay": sorted(set(hf_default_decay) - set(decay_names)),
            "hf_param_groups": hf_groups,
        },
        "repeats": tally.rows,
        "settings": {
            "model": f"BertForSequenceClassification {MODEL}, dropout 0.1, {len(LABELS)} labels",
            "params": num_params,
            "batch_size": batch_size, "seq_len": seq_len, "steps_per_run": steps, "skipped_warmup_steps": skip,
            "repeats": repeats, "interleave": interleave, "threads": threads, "precision": "fp32", "device": "cpu", "dataloader_workers": 0,
            "optimizer": f"torch AdamW lr={lr} betas=(0.9, 0.999) eps=1e-8 weight_decay={weight_decay} "
                         "(not on embeddings, LayerNorm, biases), grad clip 1.0",
            "hf_optim": hf_optim,
            "schedule": f"cosine to 0, warmup {warmup_steps} steps",
            "log_every_steps": LOG_EVERY_STEPS,
            "train_rows": len(inputs.order), "jsonl_rows": len(records), "seed": seed,
        },
        "machine": machine(load_before),
        "date": datetime.date.today().isoformat(),
    }


def profile_sides(cfg: Config, inputs: Inputs, bert_dir: Path, rng_state: torch.Tensor, top: int,
                  hf_optim: str) -> None:
    """One more run of each side under cProfile, timed in CPU seconds (steadier than wall time on a shared box)."""
    import cProfile
    import io
    import pstats

    for side in ("trainforge", "hf"):
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        out = (run_trainforge(cfg, inputs, StepProbe(side)) if side == "trainforge"
               else run_hf(cfg, inputs, bert_dir, StepProbe(side, rng_state=rng_state), hf_optim))
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
        log(f"profile of one {side} run ({cfg.train.max_steps} steps, {out['wall_s']:.1f} s wall; "
            f"cumulative CPU seconds, the whole run including setup and, for trainforge, the final evaluation, "
            f"checkpoint and report):")
        log(text.getvalue())


def render(result: dict[str, Any]) -> str:
    s, clock = result["settings"], result["clock"]
    lines = [
        f"fine-tuning: tiny BERT ({s['params']:,} parameters), batch {s['batch_size']} x {s['seq_len']} tokens, "
        f"fp32 CPU, {s['threads']} thread(s), {s['steps_per_run']} steps per run (first {s['skipped_warmup_steps']} "
        f"not timed), torch {result['machine']['torch']}, transformers {result['machine']['transformers']}",
        *repeats_table(result["repeats"]),
    ]
    c, loss = result["checks"], result["loss"]
    lines.append("")
    for name, b in result["by_clock"].items():
        lines.append(f"{name:>4}: median step over {result['timed_steps_per_side']} steps per side: trainforge "
                     f"{b['step_s']['trainforge'] * 1e3:.2f} ms, Trainer {b['step_s']['hf'] * 1e3:.2f} ms, ratio "
                     f"{b['ratio']:.3f}; spread (IQR / median) {b['relative_iqr']['trainforge']:.1%} / "
                     f"{b['relative_iqr']['hf']:.1%}"
                     + (f"; paired median ratio {b['paired_median_ratio']:.3f}" if b["paired_median_ratio"] else ""))
    verdict = "meets" if result["meets_goal"] else "MISSES"
    lines += [
        f"loss: first {loss['trainforge_first']:.4f} / {loss['hf_first']:.4f}, mean of the last "
        f"{loss['last_steps_averaged']} steps {loss['trainforge_last_mean']:.4f} / {loss['hf_last_mean']:.4f} "
        f"(trainforge / Trainer); largest per-step difference {result['max_loss_diff']:.2e}",
        f"same initial weights: {c['same_initial_weights']}; lr schedules differ by at most "
        f"{c['lr_schedule_max_abs_diff']:.2e}",
        f"ratio ({clock} time) {result['ratio']:.3f} ({verdict} the goal <= {result['goal_ratio']})",
    ]
    if result["noisy"]:
        lines.append(f"note: {clock} spread above {NOISY_SPREAD:.0%}: other processes were competing for the CPU; "
                     "rerun when the machine is quiet before trusting the ratio")
    return "\n".join(lines)


def repeats_table(repeats: list[dict[str, Any]]) -> list[str]:
    """A blank line, a header, then a line per repeat: median steps and ratios by clock, largest loss difference."""
    lines = [
        "",
        f"{'':18}  {'CPU ms per step':^26}  {'wall ms per step':^26}",
        f"{'repeat':>6}  {'first':<10}  {'trainforge':>10} {'Trainer':>8} {'ratio':>6}  "
        f"{'trainforge':>10} {'Trainer':>8} {'ratio':>6}  {'max loss diff':>13}",
    ]
    for r in repeats:
        cols = "  ".join(f"{r[f'{c}_trainforge_median_step_s'] * 1e3:>10.2f} {r[f'{c}_hf_median_step_s'] * 1e3:>8.2f} "
                         f"{r[f'{c}_ratio']:>6.3f}" for c in ("cpu", "wall"))
        lines.append(f"{r['repeat']:>6}  {r['first']:<10}  {cols}  {r['max_loss_diff']:>13.2e}")
    return lines


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=4, help="interleaved trainforge/Trainer pairs (default 4)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps per run (default 100)")
    p.add_argument("--skip", type=int, default=10, help="first steps of each run not timed (warm-up, default 10)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    p.add_argument("--seq-len", type=int, default=64, help="token ids per sample (default 64)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads, both sides (default 1: steadier on a small shared box)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="cosine warmup (default 0; with warmup the two schedules differ by one step, see the docstring)")
    p.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                   help="what the headline ratio is measured in: cpu (this process's CPU time, default: robust to "
                        "other jobs on a shared box, and equal to wall time on a quiet one with 1 thread) or wall "
                        "(use on a dedicated machine, and with --threads above 1); both are always reported")
    p.add_argument("--interleave", choices=["step", "run"], default="step",
                   help="step (default): the two runs in lockstep, one training step each in turn, so both are timed "
                        "under the same machine conditions; run: whole runs one after the other")
    p.add_argument("--hf-optim", choices=["adamw_torch", "adamw_torch_fused"], default="adamw_torch",
                   help="the Trainer's optim: adamw_torch (default) is the AdamW implementation trainforge runs on the "
                        "CPU; adamw_torch_fused is the Trainer's own default on torch >= 2.8 (same math, another kernel)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of the table")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after measuring, one more run of each side under cProfile (CPU time); print its N "
                        "costliest functions to stderr")
    args = p.parse_args(argv)
    if args.clock == "cpu" and args.threads > 1:
        log("note: --clock cpu adds up the CPU time of all threads; with --threads above 1 use --clock wall")
    for name in ("repeats", "batch_size", "seq_len", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if args.skip < 0 or args.steps < args.skip + 3:
        p.error(f"--steps must exceed --skip by at least 3 (timed steps are gaps between forwards), "
                f"got --steps {args.steps} --skip {args.skip}")
    if args.seq_len > MODEL["max_position_embeddings"]:
        p.error(f"--seq-len: at most {MODEL['max_position_embeddings']} (the model's positions)")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    with contextlib.redirect_stdout(sys.stderr):  # libraries' chatter; stdout is the result alone
        result = measure(repeats=args.repeats, steps=args.steps, skip=args.skip, batch_size=args.batch_size,
                         seq_len=args.seq_len, threads=args.threads, seed=args.seed, lr=args.lr,
                         weight_decay=args.weight_decay, warmup_steps=args.warmup_steps, clock=args.clock,
                         interleave=args.interleave, hf_optim=args.hf_optim, profile=args.profile)
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
