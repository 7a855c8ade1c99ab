"""`make gpu-check`: what trainforge promises about GPUs, measured on one CUDA GPU in one call of under 8 minutes.

    .venv/bin/python benchmarks/gpu_check.py                    # table on stderr, summary on stdout
    .venv/bin/python benchmarks/gpu_check.py --json             # one JSON document on stdout
    .venv/bin/python benchmarks/gpu_check.py --save runs/gpu-check.json --budget-s 420
    .venv/bin/python benchmarks/gpu_check.py --from runs/gpu-check.json --markdown   # docs/benchmarks.md's GPU section

In order of importance (a part that would overrun `--budget-s` is skipped and reported, not failed):

1. planner truth: digits_cnn; resnet50_synthetic (bf16, channels_last, micro-batch 64); gpt2_small_synthetic (bf16,
   micro-batch 8 and 16, with and without activation checkpointing). Each runs real trainer steps; the planner's
   peak (simulation plus correction terms, less the CUDA context, which the caching allocator does not hold) is
   compared with `torch.cuda.max_memory_reserved`, its simulated peak with `max_memory_allocated`, its
   uncalibrated step time with the measured median; ratios predicted / measured (goals: memory within 10%, time
   within 20%).
2. GPT-2 small throughput: tokens/s and model FLOPs utilization (the planner's model FLOPs / the catalog's dense
   bf16 peak of this GPU), eager against `torch.compile`.
3. the planner after `trainforge plan --calibrate` (calibrated on GPT-2 at micro-batch 8, into a temporary
   TRAINFORGE_HOME): every case's calibrated prediction against the same measurements.
4. ResNet-50 images/s with and without channels_last.
5. LoRA on a ~0.5B causal LM shaped like Qwen2.5-0.5B (built here from a config: nothing is downloaded): planned
   against measured peak memory and step time.
6. torchao int8 weight-only and dynamic (int8 activations and weights) against bf16: forward latency of GPT-2
   small, eager.

Without a CUDA GPU (or with `--plumbing`) every part runs on the CPU at tiny sizes, which checks this script's
own plumbing (CI runs it); it says "no CUDA GPU: nothing measured" and exits 0. A part that raises is reported
and the others still run; the exit code is then 1.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tiny_models: the tests' tokenizer recipe

import trainforge  # noqa: E402
from trainforge.config import ModelConfig  # noqa: E402
from trainforge.data.base import DataInfo  # noqa: E402
from trainforge.errors import UserError  # noqa: E402
from trainforge.hardware.catalog import load_catalog  # noqa: E402
from trainforge.models.hf import no_progress_bars  # noqa: E402
from trainforge.models.zoo import build_model  # noqa: E402
from trainforge.training.calibrate import MeasuredRun, calibrate, measure_steps, predict_measured  # noqa: E402
from trainforge.planning.calibration_store import HOME_ENV, load_calibration  # noqa: E402
from trainforge.planning.local import local_spec  # noqa: E402

GOALS = {"memory": 0.10, "time": 0.20}  # |predicted / measured - 1| the planner aims to stay within
NO_GPU = "no CUDA GPU: nothing measured"
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sizes:
    """The workloads: real sizes on a GPU, tiny ones on the CPU (where only the plumbing is checked)."""

    steps: int  # measured optimizer steps per run (after `warmup`)
    warmup: int
    digits: list[str]  # overrides of each recipe
    resnet: list[str]
    resnet_micro: int
    gpt2: list[str]
    gpt2_micros: tuple[int, int]  # the planner cases; the larger one is the throughput case
    llm_shape: dict[str, Any]  # LlamaConfig fields of the LoRA base
    lora: list[str]
    chats: int  # conversations in the LoRA data file
    answer_sentences: int  # sentences per answer (a conversation must fit the LoRA run's seq_len)
    int8_shapes: tuple[tuple[int, int], ...]  # (batch, tokens) of the int8 forward timings
    int8_repeats: int


GPU_SIZES = Sizes(
    steps=10, warmup=3,
    digits=[],
    resnet=["data.args.num_samples=1600"],
    resnet_micro=64,
    gpt2=["data.args.num_samples=1200"],
    gpt2_micros=(8, 16),
    # Qwen2.5-0.5B's shape (tied embeddings, grouped-query attention) on Llama's architecture
    llm_shape=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                   num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=2048),
    lora=["data.args.seq_len=1024", "train.global_batch_size=8", "train.micro_batch_size=8"],
    chats=3000,
    answer_sentences=4,
    int8_shapes=((1, 128), (8, 1024)),
    int8_repeats=20,
)
CPU_SIZES = Sizes(
    steps=2, warmup=1,
    digits=["train.device=cpu"],
    # 64 px: ResNet's last feature map is 2x2, so BatchNorm has more than one value per channel at micro-batch 1
    resnet=["train.device=cpu", "model.args.arch=resnet18", "data.args.image_size=64", "data.args.num_samples=80",
            "data.args.num_classes=10"],
    resnet_micro=4,
    gpt2=["train.device=cpu", "data.args.num_samples=80", "data.args.seq_len=32", "data.args.vocab_size=128",
          "model.args.n_layer=2", "model.args.n_head=2", "model.args.n_embd=32", "model.args.vocab_size=128",
          "model.args.block_size=32"],
    gpt2_micros=(2, 4),
    llm_shape=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, vocab_size=512, tie_word_embeddings=True, max_position_embeddings=128),
    lora=["train.device=cpu", "data.args.seq_len=128", "train.global_batch_size=2", "train.micro_batch_size=2"],
    chats=60,
    answer_sentences=1,
    int8_shapes=((1, 8),),
    int8_repeats=2,
)
# GPU seconds each part is expected to take on an H100-class GPU (setup and planner simulations included): a part
# is skipped when it would overrun the budget
ESTIMATE_S = {"run": 25, "compile": 100, "calibrate": 60, "lora": 120, "int8": 45}
# what `--parts` can name, in the order they run
PART_ORDER = ("planner", "throughput", "calibrate", "resnet", "lora", "int8")
PARTS = frozenset(PART_ORDER)
INT8_TIMED_S = 10.0  # at most this long timing one variant at one shape (a slow fallback kernel must not eat the budget)


def short(extra: list[str]) -> list[str]:
    """Overrides for a short measured run (the step count is `measure_steps`'): a warm-up the run can finish."""
    return ["schedule.warmup_steps=1", "log.progress=false", "log.tensorboard=false", *extra]


# ---------------------------------------------------------------- the report being built


class Check:
    """The document being filled, the budget, and what was skipped or failed."""

    def __init__(self, budget_s: float, gpu: bool, *, save: Optional[Path] = None,
                 parts: frozenset[str] = PARTS, cases: Optional[str] = None) -> None:
        self.start = time.monotonic()
        self.budget_s, self.gpu, self.save, self.parts, self.cases = budget_s, gpu, save, parts, cases
        self.doc: dict[str, Any] = {"benchmark": "gpu_check", "mode": "gpu" if gpu else "plumbing", "measured": gpu,
                                    "goals": {"memory_within": GOALS["memory"], "time_within": GOALS["time"]},
                                    "budget_s": budget_s, "parts": sorted(parts), "cases": cases,
                                    "complete": False, "skipped": [], "errors": []}

    def wants(self, part: str) -> bool:
        """Whether `--parts` asked for `part`; one left out is recorded as skipped."""
        if part in self.parts:
            return True
        self.doc["skipped"].append({"what": part, "why": "not in --parts"})
        return False

    def saved(self) -> None:
        """Write the document so far to `--save`: a command killed at its time limit keeps what it measured."""
        if self.save is not None:
            self.save.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.save.with_name(self.save.name + ".tmp")
            tmp.write_text(json.dumps(finish(self), indent=1) + "\n")
            tmp.replace(self.save)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def affordable(self, what: str, estimate_s: float) -> bool:
        """Whether `what` fits in what is left of the budget; recorded as skipped when it does not."""
        left = self.budget_s - self.elapsed_s()
        if estimate_s <= left:
            return True
        self.doc["skipped"].append({"what": what, "why": f"budget: {left:.0f} s left, needs about {estimate_s:.0f} s"})
        say(f"skipped {what}: {left:.0f} s of the budget left, needs about {estimate_s:.0f} s")
        return False

    @contextlib.contextmanager
    def part(self, what: str) -> Iterator[None]:
        """A part that raises is reported (its traceback on stderr) and the others go on."""
        begun = time.monotonic()
        say(f"-- {what}")
        try:
            yield
        except Exception as e:  # noqa: BLE001 - one failed measurement must not cost the GPU minutes of the rest
            traceback.print_exc(file=sys.stderr)
            self.doc["errors"].append({"what": what, "error": f"{type(e).__name__}: {e}"[:500]})
        finally:
            if self.gpu:
                gc.collect()
                torch.cuda.empty_cache()
            say(f"   {what}: {time.monotonic() - begun:.1f} s")
            self.saved()


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def within(r: Optional[float], goal: float) -> Optional[bool]:
    return None if r is None else abs(r - 1) <= goal


# ---------------------------------------------------------------- environment


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": git_commit(), "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "device": str(device), "cpu_count": os.cpu_count(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=torch.cuda.get_device_name(device), gpu_memory_bytes=props.total_memory,
                   compute_capability=f"{props.major}.{props.minor}", driver=nvidia_driver(),
                   bf16_supported=torch.cuda.is_bf16_supported())
    try:
        spec = local_spec(device, load_catalog())
        env.update(catalog_name=spec.name, catalog_bf16_dense_flops=spec.peak_flops.get("bf16"),
                   catalog_fp32_dense_flops=spec.peak_flops.get("fp32"))
    except UserError as e:  # a GPU the catalog lacks: the planner cannot predict for it
        env["catalog_name"], env["catalog_error"] = None, str(e)
    return env


def git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def nvidia_driver() -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


# ---------------------------------------------------------------- 1. planner truth


@dataclass
class Case:
    name: str
    recipe: str
    overrides: list[str]
    cfg: Any = None
    measured: Optional[MeasuredRun] = None


def planner_cases(sizes: Sizes) -> list[Case]:
    m8, m16 = sizes.gpt2_micros
    gpt2 = [*sizes.gpt2, "train.precision=bf16"]
    resnet = [*sizes.resnet, "train.precision=bf16", "train.channels_last=true",
              f"train.micro_batch_size={sizes.resnet_micro}", f"train.global_batch_size={sizes.resnet_micro}"]
    return [
        Case(f"gpt2_small bf16 b{m16}", "gpt2_small_synthetic", [*gpt2, *batch(m16), "train.activation_checkpointing=false"]),
        Case(f"gpt2_small bf16 b{m8}", "gpt2_small_synthetic", [*gpt2, *batch(m8), "train.activation_checkpointing=false"]),
        Case(f"gpt2_small bf16 b{m16} +ckpt", "gpt2_small_synthetic", [*gpt2, *batch(m16), "train.activation_checkpointing=true"]),
        Case(f"gpt2_small bf16 b{m8} +ckpt", "gpt2_small_synthetic", [*gpt2, *batch(m8), "train.activation_checkpointing=true"]),
        Case(f"resnet50 bf16 channels_last b{sizes.resnet_micro}", "resnet50_synthetic", resnet),
        Case("digits_cnn", "digits_cnn", list(sizes.digits)),
    ]


def batch(micro: int) -> list[str]:
    return [f"train.micro_batch_size={micro}", f"train.global_batch_size={micro}"]


def measure_case(case: Case, sizes: Sizes) -> None:
    case.cfg = trainforge.load_config(case.recipe, short(case.overrides))
    case.measured = measure_steps(case.cfg, steps=sizes.steps, warmup=sizes.warmup)


def truth_row(case: Case, calibration: Optional[dict] = None) -> dict[str, Any]:
    """The planner's prediction for the setup the case ran, against what it measured."""
    m = case.measured
    p = predict_measured(case.cfg, m, calibration={} if calibration is None else calibration)
    corrections = dict(p.corrections_bytes or {})
    # the CUDA context lives outside the caching allocator: the rest of the prediction is what `reserved` counts
    in_allocator = p.peak_bytes_per_gpu - corrections.get("cuda_context", 0)
    row = {
        "case": case.name, "micro_batch_size": m.setup.micro_batch_size, "precision": m.setup.precision,
        "activation_checkpointing": m.setup.activation_checkpointing, "channels_last": m.setup.channels_last,
        "predicted_peak_bytes": p.peak_bytes_per_gpu, "predicted_reserved_bytes": in_allocator,
        "simulated_peak_bytes": p.simulated_peak_bytes_per_gpu, "corrections_bytes": corrections,
        "measured_reserved_bytes": m.reserved_bytes, "measured_allocated_bytes": m.allocated_bytes,
        "memory_ratio": ratio(in_allocator, m.reserved_bytes),
        "simulated_vs_allocated": ratio(p.simulated_peak_bytes_per_gpu, m.allocated_bytes),
        "predicted_step_s": p.step_time_s, "measured_step_s": m.step_time_s,
        "time_ratio": ratio(p.step_time_s, m.step_time_s), "bound": p.bound, "efficiency": p.efficiency,
        "data_wait_frac": m.data_wait_frac, "samples_per_s": m.samples_per_s,
        "model_flops_per_sample": p.model_flops_per_sample,
    }
    row["memory_within_goal"] = within(row["memory_ratio"], GOALS["memory"])
    row["time_within_goal"] = within(row["time_ratio"], GOALS["time"])
    return row


def planner_truth(check: Check, sizes: Sizes) -> list[Case]:
    rows, measured = [], []
    check.doc["planner"] = rows  # filled case by case: each part's save holds the cases measured so far
    for case in planner_cases(sizes):
        if check.cases and check.cases not in case.name:
            check.doc["skipped"].append({"what": f"planner: {case.name}", "why": f"not matched by --cases {check.cases!r}"})
            continue
        if not check.affordable(f"planner: {case.name}", ESTIMATE_S["run"]):
            continue
        with check.part(f"planner: {case.name}"):
            measure_case(case, sizes)
            rows.append(truth_row(case))
            measured.append(case)
            say(row_line(rows[-1]))
    return measured


# ---------------------------------------------------------------- 2. GPT-2 throughput, eager and compiled


def mfu(flops_per_sample: Optional[float], samples_per_s: float, peak_flops: Optional[float]) -> Optional[float]:
    """Model FLOPs utilization: the model's forward + backward FLOPs per second over the GPU's dense peak."""
    return None if not flops_per_sample or not peak_flops else flops_per_sample * samples_per_s / peak_flops


def gpt2_throughput(check: Check, sizes: Sizes, measured: list[Case]) -> None:
    eager = next((c for c in measured if c.name.endswith(f"b{sizes.gpt2_micros[1]}")), None)
    if eager is None:
        check.doc["skipped"].append({"what": "gpt2 throughput", "why": "its eager planner case was not measured"})
        return
    peak = check.doc["environment"].get("catalog_bf16_dense_flops")
    flops = next(r["model_flops_per_sample"] for r in check.doc["planner"] if r["case"] == eager.name)
    seq_len = eager.cfg.data.args["seq_len"]
    out: dict[str, Any] = {"micro_batch_size": eager.measured.setup.micro_batch_size, "seq_len": seq_len,
                           "peak_flops_bf16": peak, "model_flops_per_sample": flops,
                           "eager": throughput(eager.measured, seq_len, flops, peak)}
    check.doc["gpt2_throughput"] = out
    if not check.affordable("gpt2 throughput: compile", ESTIMATE_S["compile"]):
        return
    with check.part("gpt2 throughput: compile"):
        compiled = Case(eager.name + " compile", eager.recipe, [*eager.overrides, "train.compile=true"])
        measure_case(compiled, sizes)
        out["compile"] = throughput(compiled.measured, seq_len, flops, peak)
        out["compile_speedup"] = eager.measured.step_time_s / compiled.measured.step_time_s
        say(f"   gpt2 tokens/s eager {out['eager']['tokens_per_s']:,.0f}, compiled {out['compile']['tokens_per_s']:,.0f} "
            f"(x{out['compile_speedup']:.2f})")


def throughput(m: MeasuredRun, seq_len: int, flops: Optional[float], peak: Optional[float]) -> dict[str, Any]:
    return {"step_s": m.step_time_s, "samples_per_s": m.samples_per_s, "tokens_per_s": m.samples_per_s * seq_len,
            "mfu": mfu(flops, m.samples_per_s, peak), "data_wait_frac": m.data_wait_frac,
            "reserved_bytes": m.reserved_bytes}


# ---------------------------------------------------------------- 3. after --calibrate


def planner_calibrated(check: Check, sizes: Sizes, measured: list[Case]) -> None:
    source = next((c for c in measured if c.name == f"gpt2_small bf16 b{sizes.gpt2_micros[0]}"), None)
    if source is None:
        check.doc["skipped"].append({"what": "planner after --calibrate", "why": "its GPT-2 case was not measured"})
        return
    if not check.affordable("planner after --calibrate", ESTIMATE_S["calibrate"]):
        return
    with check.part("planner after --calibrate"), tempfile.TemporaryDirectory(prefix="trainforge-home-") as home:
        previous = os.environ.get(HOME_ENV)
        os.environ[HOME_ENV] = home  # the user's own calibration file is neither read nor overwritten
        try:
            entry = calibrate(source.cfg, steps=sizes.steps)
            stored = load_calibration()
        finally:
            if previous is None:
                os.environ.pop(HOME_ENV, None)
            else:
                os.environ[HOME_ENV] = previous
        factors = {k: entry.get(k) for k in ("time_factor", "memory_factor")}
        rows = [truth_row(c, calibration=stored) for c in measured]
        check.doc["planner_calibrated"] = {"calibrated_on": source.name, "device": entry["device"], **factors,
                                           "rows": rows}
        for row in rows:
            say(row_line(row))


# ---------------------------------------------------------------- 4. ResNet-50, channels_last or not


def resnet_throughput(check: Check, sizes: Sizes, measured: list[Case]) -> None:
    last = next((c for c in measured if c.recipe == "resnet50_synthetic"), None)
    if last is None:
        check.doc["skipped"].append({"what": "resnet50 throughput", "why": "its planner case was not measured"})
        return
    if not check.affordable("resnet50 throughput: without channels_last", ESTIMATE_S["run"]):
        return
    with check.part("resnet50 throughput: without channels_last"):
        plain = Case(last.name.replace("channels_last", "NCHW"), last.recipe,
                     [o for o in last.overrides if not o.startswith("train.channels_last=")] + ["train.channels_last=false"])
        measure_case(plain, sizes)
        check.doc["resnet50_throughput"] = {
            "micro_batch_size": last.measured.setup.micro_batch_size,
            "channels_last": {"images_per_s": last.measured.samples_per_s, "step_s": last.measured.step_time_s,
                              "data_wait_frac": last.measured.data_wait_frac},
            "nchw": {"images_per_s": plain.measured.samples_per_s, "step_s": plain.measured.step_time_s,
                     "data_wait_frac": plain.measured.data_wait_frac},
            "channels_last_speedup": plain.measured.step_time_s / last.measured.step_time_s,
        }


# ---------------------------------------------------------------- 5. LoRA on a ~0.5B causal LM


def save_llm(directory: Path, shape: dict[str, Any], chats: int, answer_sentences: int) -> Path:
    """A causal LM of `shape` with random weights and a byte-level BPE tokenizer (with a chat template), as
    `save_pretrained` writes them, and a chat JSONL file beside it. Nothing is downloaded."""
    from tiny_models import bytelevel_tokenizer, corpus
    from transformers import AutoModelForCausalLM, LlamaConfig

    texts = corpus(400)
    tok = bytelevel_tokenizer(texts)
    tok.chat_template = ("{% for m in messages %}{{ m['role'] + '\\n' + m['content'] + eos_token }}{% endfor %}"
                         "{% if add_generation_prompt %}{{ 'assistant\\n' }}{% endif %}")
    torch.manual_seed(0)
    config = LlamaConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **shape)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with no_progress_bars():
        model.save_pretrained(directory / "model")
    tok.save_pretrained(directory / "model")
    rng = random.Random(0)
    lines = []
    for _ in range(chats):
        question, answer = rng.choice(texts), " ".join(rng.choice(texts) for _ in range(answer_sentences))
        lines.append(json.dumps({"messages": [{"role": "user", "content": question},
                                              {"role": "assistant", "content": answer}]}))
    (directory / "chats.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def lora_finetune(check: Check, sizes: Sizes) -> None:
    if not check.affordable("lora: ~0.5B causal LM", ESTIMATE_S["lora"]):
        return
    with check.part("lora: ~0.5B causal LM"), tempfile.TemporaryDirectory(prefix="trainforge-llm-") as tmp:
        files = save_llm(Path(tmp), sizes.llm_shape, sizes.chats, sizes.answer_sentences)
        case = Case("lora r16 all-linear", "llm_lora_sft",
                    [f"model.args.pretrained={files / 'model'}", f"data.path={files / 'chats.jsonl'}", *sizes.lora])
        measure_case(case, sizes)
        row = truth_row(case)
        row["parameters"] = sum(p.numel() for p in _meta_llm(sizes.llm_shape).parameters())
        check.doc["lora"] = row
        say(row_line(row))


def _meta_llm(shape: dict[str, Any]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(LlamaConfig(**shape))


# ---------------------------------------------------------------- 6. torchao int8 against bf16


def int8_speed(check: Check, sizes: Sizes, device: torch.device) -> None:
    if not check.affordable("int8: torchao against bf16", ESTIMATE_S["int8"]):
        return
    with check.part("int8: torchao against bf16"):
        # heavy and optional at import (torchao registers its tensor subclasses): only this part needs it
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

        cfg = trainforge.load_config("gpt2_small_synthetic", sizes.gpt2)
        seq = max(t for _, t in sizes.int8_shapes)
        info = DataInfo("lm", "text", (seq,), "int64", cfg.model.args["vocab_size"],
                        vocab_size=cfg.model.args["vocab_size"], seq_len=seq)
        variants = {"bf16": None, "int8_weight_only": Int8WeightOnlyConfig(),
                    "int8_dynamic": Int8DynamicActivationInt8WeightConfig()}
        models = {}
        for name, qcfg in variants.items():
            torch.manual_seed(0)
            model, _ = build_model(ModelConfig(name="gpt", args={**cfg.model.args, "block_size": seq}), info)
            model = model.to(device=device, dtype=torch.bfloat16).eval()
            if qcfg is not None:
                quantize_(model, qcfg)
            models[name] = model
        rows = []
        for b, t in sizes.int8_shapes:
            x = torch.randint(0, info.vocab_size, (b, t), device=device)
            times = {name: forward_time_s(m, x, sizes.int8_repeats, device) for name, m in models.items()}
            rows.append({"batch": b, "tokens": t, **{f"{k}_s": v for k, v in times.items()},
                         "weight_only_speedup": times["bf16"] / times["int8_weight_only"],
                         "dynamic_speedup": times["bf16"] / times["int8_dynamic"]})
            say(f"   int8 b{b}x{t}: bf16 {times['bf16'] * 1e3:.2f} ms, weight-only x{rows[-1]['weight_only_speedup']:.2f}, "
                f"dynamic x{rows[-1]['dynamic_speedup']:.2f}")
        check.doc["int8"] = {"model": "gpt2_small (zoo gpt), eval, eager (no torch.compile)", "rows": rows}


@torch.inference_mode()
def forward_time_s(model: torch.nn.Module, x: torch.Tensor, repeats: int, device: torch.device,
                   limit_s: float = INT8_TIMED_S) -> float:
    """Median forward latency after two warm-up calls; fewer than `repeats` timed calls once `limit_s` is spent."""
    times: list[float] = []
    begun = time.perf_counter()
    for i in range(repeats + 2):
        if times and time.perf_counter() - begun > limit_s:
            break
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        model(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


# ---------------------------------------------------------------- the whole check


def run_check(budget_s: float, plumbing: bool, *, save: Optional[Path] = None, parts: frozenset[str] = PARTS,
              cases: Optional[str] = None) -> dict[str, Any]:
    gpu = torch.cuda.is_available() and not plumbing
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    sizes = GPU_SIZES if gpu else CPU_SIZES
    check = Check(budget_s, gpu, save=save, parts=parts, cases=cases)
    if not gpu:
        say(f"{NO_GPU}; checking this script's plumbing on the CPU with tiny sizes")
        check.doc["message"] = NO_GPU
    check.doc["environment"] = environment(device)
    if check.doc["environment"].get("catalog_name") is None:
        check.doc["errors"].append({"what": "environment", "error": check.doc["environment"]["catalog_error"]})
        return finish(check)
    measured = planner_truth(check, sizes) if check.wants("planner") else []
    if check.wants("throughput"):
        gpt2_throughput(check, sizes, measured)
    if check.wants("calibrate"):
        planner_calibrated(check, sizes, measured)
    if check.wants("resnet"):
        resnet_throughput(check, sizes, measured)
    if check.wants("lora"):
        lora_finetune(check, sizes)
    if check.wants("int8"):
        int8_speed(check, sizes, device)
    check.doc["complete"] = True
    check.saved()
    return finish(check)


def finish(check: Check) -> dict[str, Any]:
    """The document with its headline ratios filled in from what was measured so far."""
    doc = check.doc
    rows = doc.get("planner") or []
    memory = [r["memory_ratio"] for r in rows if r["memory_ratio"] is not None]
    times = [r["time_ratio"] for r in rows if r["time_ratio"] is not None]
    # the headline: the planner's peak memory against max_memory_reserved, median over the cases (GPU only)
    doc["ratio"] = statistics.median(memory) if memory else None
    doc["time_ratio"] = statistics.median(times) if times else None
    doc["wall_s"] = check.elapsed_s()
    return doc


# ---------------------------------------------------------------- output


def gib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 2**30:.3g}"


def fmt(x: Optional[float], spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def row_line(r: dict[str, Any]) -> str:
    return (f"   {r['case']:<34} peak {gib(r['predicted_reserved_bytes'])} / {gib(r['measured_reserved_bytes'])} GiB "
            f"(x{fmt(r['memory_ratio'])})  step {r['predicted_step_s'] * 1e3:.1f} / {r['measured_step_s'] * 1e3:.1f} ms "
            f"(x{fmt(r['time_ratio'])})")


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table (first column left, the others right aligned) and the blank line after it."""
    return ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1),
            *("| " + " | ".join(row) + " |" for row in rows), ""]


def markdown(doc: dict[str, Any]) -> str:
    """docs/benchmarks.md's GPU section, filled from one document."""
    env = doc["environment"]
    where = (f"{env['gpu']} ({gib(env['gpu_memory_bytes'])} GiB, driver {env.get('driver') or '-'})" if "gpu" in env
             else f"the CPU ({env['cpu_count']} cores)")
    head = (f"Measured {env['date']} at commit `{env['commit']}` on {where}, torch {env['torch']} "
            f"(CUDA build {env.get('cuda') or '-'}); `make gpu-check` took {doc['wall_s']:.0f} s.")
    if not doc["measured"]:
        head += f" **{NO_GPU}** (plumbing mode on the CPU: the figures below are tiny CPU runs, not GPU figures)."
    if not doc.get("complete", True):
        head += " **Incomplete:** the command stopped before its end; below is what it had saved."
    if doc.get("parts") and set(doc["parts"]) != PARTS or doc.get("cases"):
        head += (f" Parts run: {', '.join(p for p in PART_ORDER if p in doc['parts'])}"
                 + (f" (planner cases matching {doc['cases']!r})" if doc.get("cases") else "") + ".")
    out = [head, ""]

    def truth_table(rows: list[dict[str, Any]]) -> None:
        out.extend(table(
            ["case", "predicted GiB (no context)", "reserved GiB", "ratio", "simulated / allocated",
             "predicted step ms", "measured step ms", "ratio", "data wait"],
            [[r["case"], gib(r["predicted_reserved_bytes"]), gib(r["measured_reserved_bytes"]), fmt(r["memory_ratio"]),
              fmt(r["simulated_vs_allocated"]), f"{r['predicted_step_s'] * 1e3:.1f}", f"{r['measured_step_s'] * 1e3:.1f}",
              fmt(r["time_ratio"]), f"{r['data_wait_frac']:.0%}"] for r in rows]))

    if doc.get("planner"):
        out.append(f"**Planner truth** (goals: peak within {GOALS['memory']:.0%}, step time within {GOALS['time']:.0%}; "
                   "ratio = predicted / measured):")
        out.append("")
        truth_table(doc["planner"])
    cal = doc.get("planner_calibrated")
    if cal:
        out.append(f"**After `--calibrate`** on {cal['calibrated_on']} (time factor {fmt(cal['time_factor'])}, "
                   f"memory factor {fmt(cal['memory_factor'])}):")
        out.append("")
        truth_table(cal["rows"])
    g = doc.get("gpt2_throughput")
    if g:
        rows = [[label, f"{g[label]['tokens_per_s']:,.0f}", fmt(g[label]["mfu"], ".1%"), f"{g[label]['step_s'] * 1e3:.1f}"]
                for label in ("eager", "compile") if label in g]
        if "compile_speedup" in g:
            rows.append(["compile speed-up", f"x{g['compile_speedup']:.2f}", "", ""])
        out += [f"**GPT-2 small** (bf16, micro-batch {g['micro_batch_size']}, {g['seq_len']} tokens):", "",
                *table(["", "tokens/s", "MFU", "step ms"], rows)]
    r50 = doc.get("resnet50_throughput")
    if r50:
        out.append(f"**ResNet-50** (bf16, micro-batch {r50['micro_batch_size']}): channels_last "
                   f"{r50['channels_last']['images_per_s']:,.0f} images/s, NCHW {r50['nchw']['images_per_s']:,.0f} "
                   f"images/s (x{r50['channels_last_speedup']:.2f}).")
        out.append("")
    lora = doc.get("lora")
    if lora:
        shape = "Qwen2.5-0.5B's shape" if doc["measured"] else "a tiny stand-in"
        out.append(f"**LoRA** on a {lora['parameters']:,}-parameter causal LM ({shape}, random weights, "
                   f"micro-batch {lora['micro_batch_size']}, activation checkpointing "
                   f"{'on' if lora['activation_checkpointing'] else 'off'}):")
        out.append("")
        truth_table([lora])
    q = doc.get("int8")
    if q:
        rows = [[f"{r['batch']} x {r['tokens']}", f"{r['bf16_s'] * 1e3:.2f}", f"x{r['weight_only_speedup']:.2f}",
                 f"x{r['dynamic_speedup']:.2f}"] for r in q["rows"]]
        out += [f"**torchao int8** against bf16, {q['model']}:", "",
                *table(["batch x tokens", "bf16 ms", "weight-only", "dynamic"], rows)]
    for s in doc["skipped"]:
        out.append(f"- skipped {s['what']}: {s['why']}")
    for e in doc["errors"]:
        out.append(f"- failed {e['what']}: {e['error']}")
    return "\n".join(out).rstrip() + "\n"


def summary(doc: dict[str, Any]) -> str:
    lines = [f"gpu_check ({doc['mode']}): {doc['wall_s']:.0f} s"]
    if not doc["measured"]:
        lines.append(NO_GPU)
    lines.append(f"planner peak memory / max_memory_reserved, median: {fmt(doc['ratio'])}; "
                 f"step time predicted / measured, median: {fmt(doc['time_ratio'])}")
    lines += [f"skipped {s['what']}: {s['why']}" for s in doc["skipped"]]
    lines += [f"FAILED {e['what']}: {e['error']}" for e in doc["errors"]]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("--markdown", action="store_true", help="print docs/benchmarks.md's GPU section on stdout")
    parser.add_argument("--budget-s", type=float, default=420.0, help="wall seconds to spend; parts that would overrun are skipped")
    parser.add_argument("--save", type=Path, help="also write the JSON document to this file")
    parser.add_argument("--from", dest="from_file", type=Path, help="render a saved document instead of measuring")
    parser.add_argument("--plumbing", action="store_true", help="tiny sizes on the CPU even where a GPU is present")
    parser.add_argument("--parts", default=",".join(PART_ORDER),
                        help=f"comma-separated parts to run, of {', '.join(PART_ORDER)} (default: all)")
    parser.add_argument("--cases", help="only the planner cases whose name contains this text (e.g. 'gpt2')")
    args = parser.parse_args(argv)
    parts = frozenset(p.strip() for p in args.parts.split(",") if p.strip())
    if not parts or parts - PARTS:
        print(f"error: --parts: unknown {', '.join(sorted(parts - PARTS)) or 'empty list'}; "
              f"expected a comma-separated list of {', '.join(PART_ORDER)}", file=sys.stderr)
        return 2
    if args.from_file is not None:
        try:
            doc = json.loads(args.from_file.read_text())
        except (OSError, ValueError) as e:
            print(f"error: --from {args.from_file}: {e}", file=sys.stderr)
            return 2
    else:
        doc = run_check(args.budget_s, args.plumbing, save=args.save, parts=parts, cases=args.cases)
    if args.json:
        print(json.dumps(doc, indent=1))
    elif args.markdown:
        print(markdown(doc), end="")
    else:
        print(summary(doc))
    if args.from_file is None and (args.json or args.markdown):
        say(summary(doc))
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
