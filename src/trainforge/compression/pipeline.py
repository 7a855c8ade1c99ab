"""`trainforge.compression(...)`: a checkpoint in, deployable artifacts and a before/after table out.

    doc = compress("runs/digits", options=CompressOptions(prune=0.5, distill=True))
    doc["variants"]   # fp32, pruned, int8, pruned+int8: params, bytes, latency, accuracy; one `recommended`

Stages, each optional: structured pruning + fine-tuning through the normal training loop (optionally
distilled from the unpruned model), ONNX export, int8 with ONNX Runtime, and on CUDA torchao weight
quantization. Every ONNX variant is measured the same way: its test-split metrics from onnxruntime
outputs, its file size, and its CPU latency at a fixed thread count for batch 1 and batch 32. One variant is
marked `recommended` (`trainforge.compression.recommend`: the fastest at batch 32 within the accuracy
tolerance of fp32); `trainforge predict` serves it from the folder without measuring again.
Writes to OUT (default RUN/compressed/): the .onnx files, finetune/ (the pruned model's run
directory), compress.json (the table), manifest.json (the SHA-256 of each file there, written last,
checked by `trainforge predict`) and a "Compression" section in the run's report.html.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch import nn

from trainforge.compression import bench
from trainforge.compression.artifact import FILE_NAMES, artifact_meta
from trainforge.compression.distill import distillation_loss
from trainforge.compression.export import export_onnx
from trainforge.compression.prune import PruneResult, PruningUnsupported, count, prune_model
from trainforge.compression.quantize import choose_method, quantize_onnx
from trainforge.compression.options import CompressOptions  # noqa: F401  (compress takes one)
from trainforge.compression.recommend import mark
from trainforge.compression.render import report_section
from trainforge.compression.torchao_quant import torchao_variant
from trainforge.config import config_from_dict
from trainforge.data import build_data
from trainforge.errors import UserError
from trainforge.integrity import write_manifest
from trainforge.report import write_report
from trainforge.training.api import train
from trainforge.training.artifacts import load_trained
from trainforge.engine.hooks import FitHooks, RunObserver
from trainforge.layout import COMPRESSED, COMPRESS_RECORD, CONFIG, METRICS

TEMP_SUFFIXES = (".export.onnx", ".prep.onnx", ".q.onnx")  # left by a crash mid-export or mid-quantization


@dataclass
class Split:
    """One split as arrays, the way the model takes it."""

    inputs: np.ndarray
    labels: np.ndarray


def compress(checkpoint: str | Path, out: Optional[str | Path] = None, options: Optional[CompressOptions] = None,
             log: Callable[[str], None] = lambda msg: None, observer: Optional[RunObserver] = None) -> dict[str, Any]:
    """Run the stages `options` asks for on CHECKPOINT (run dir, final/ or checkpoints/step-*); see module doc.
    `observer`: watches the pruned model's fine-tuning run and gets the variants when they are written (the caller
    composes it: `trainforge.compress` and the command line pass the MLflow observer of log.mlflow)."""
    options = options or CompressOptions()
    options.check()
    trained = load_trained(Path(checkpoint), verify=options.verify)
    run_dir = owning_run_dir(trained.source)
    out_dir = Path(out) if out else (run_dir or trained.source) / COMPRESSED
    continuing = check_out_dir(out_dir)
    if continuing:
        log(f"continuing the unfinished compression in {out_dir}")

    cfg, info = trained.config, trained.info
    test, calibration = load_splits(cfg, options.calibration_samples, trained.preprocess)
    model = trained.build_model().eval()
    example = torch.from_numpy(test.inputs[:2])
    teacher_logits = torch_logits(model, test.inputs)
    out_dir.mkdir(parents=True, exist_ok=True)

    flops, params = count(model, example)
    variants: list[dict[str, Any]] = []
    measure = Measurer(test, info.task, options, log)
    log("exporting fp32 ONNX")
    fp32 = export_onnx(model, example, out_dir / FILE_NAMES["fp32"], artifact_meta("fp32", info, trained.preprocess))
    variants.append(measure("fp32", fp32, params, flops, reference=teacher_logits))

    pruning: Optional[dict[str, Any]] = None
    finetune: Optional[dict[str, Any]] = None
    pruned_path: Optional[Path] = None
    result: Optional[PruneResult] = None
    if options.prune > 0:
        log(f"pruning {options.prune:.0%} of each prunable width")
        try:
            result = prune_model(model, example, options.prune)
        except PruningUnsupported as e:  # one line; the other variants are still written
            log(f"warning: {e}")
            pruning = {"ratio": options.prune, "skipped": str(e)}
    if result is not None:
        pruning = {k: v for k, v in dataclasses.asdict(result).items() if k != "model"}
        pruned_model = result.model
        if options.finetune_epochs > 0:
            pruned_model, finetune = fine_tune(result, model, cfg, info.task, out_dir / "finetune", options, log,
                                               observer)
        pruned_model.eval()
        pruned_path = export_onnx(pruned_model, example, out_dir / FILE_NAMES["pruned"],
                                  artifact_meta("pruned", info, trained.preprocess))
        pruned_logits = torch_logits(pruned_model, test.inputs)
        variants.append(measure("pruned", pruned_path, result.params_after, result.flops_after, reference=pruned_logits))

    method = None
    if options.quantize == "int8":
        method = choose_method(model, example) if options.int8_method == "auto" else options.int8_method
        batches = [calibration.inputs[i:i + 32] for i in range(0, len(calibration.inputs), 32)]
        sources = [("int8", fp32, params, flops, teacher_logits)]
        if pruned_path is not None:
            sources.append(("pruned+int8", pruned_path, pruning["params_after"], pruning["flops_after"], pruned_logits))
        for name, src, n_params, n_flops, reference in sources:
            log(f"quantizing {src.name} to int8 ({method})")
            path = quantize_onnx(src, out_dir / FILE_NAMES[name], method, artifact_meta(name, info, trained.preprocess),
                                 calibration=batches)
            variants.append(measure(name, path, n_params, n_flops, reference=reference))
    elif options.quantize.startswith("torchao"):
        log(f"quantizing Linear weights with {options.quantize}")
        variants.append(torchao_variant(model, options.quantize, test, teacher_logits, out_dir, params, flops,
                                        info.task, options.bench_s, options.device))

    add_comparisons(variants)
    choice = mark(variants, options.accuracy_tolerance_pt)
    log(f"recommended: {choice.reason}")
    doc = {
        "checkpoint": str(trained.source),
        "out": str(out_dir),
        "task": info.task,
        "threads": options.threads,
        "int8_method": method,
        "pruning": pruning,
        "finetune": finetune,
        "test_samples": int(len(test.labels)),
        "variants": variants,
        "recommendation": {"variant": choice.name, "file": FILE_NAMES[choice.name], "reason": choice.reason,
                           "accuracy_tolerance_pt": options.accuracy_tolerance_pt},
    }
    (out_dir / COMPRESS_RECORD).write_text(json.dumps(doc, indent=1))
    write_manifest(out_dir)  # last: it vouches for every file above, the ones predict serves included
    if run_dir is not None:
        doc["report"] = str(write_report(run_dir, extra_sections=[("Compression", report_section(doc))]))
        if observer is not None and cfg.log.mlflow is not None and out_dir.resolve() == (run_dir / COMPRESSED).resolve():
            doc["mlflow"] = publish(observer, run_dir, cfg, log)
    return doc


def publish(observer: RunObserver, run_dir: Path, cfg: Any, log: Callable[[str], None]) -> Optional[dict[str, Any]]:
    """A run that logs to MLflow (log.mlflow) gets its recommended ONNX variant there too, as a new version of its
    registered model; a tracker that fails is one line (the files are complete: `trainforge runs sync` later)."""
    try:
        result = observer.publish(run_dir, cfg)
    except UserError as e:
        log(f"warning: {e}")
        return None
    if result is None:
        return None
    version = f", registered as version {result['onnx_version']}" if result.get("onnx_version") else ""
    log(f"MLflow: the ONNX variant is logged to run {result['run_id']} at {result['tracking_uri']}{version}")
    return result


class Measurer:
    """One row of the table per ONNX variant: size, test metrics, agreement with PyTorch, latency."""

    def __init__(self, test: Split, task: str, options: CompressOptions, log: Callable[[str], None]) -> None:
        self.test, self.task, self.options, self.log = test, task, options, log

    def __call__(self, name: str, path: Path, params: int, flops: int, reference: np.ndarray) -> dict[str, Any]:
        self.log(f"measuring {name}: test split, latency at batch {', '.join(map(str, bench.BENCH_BATCHES))}")
        session = bench.ort_session(path, self.options.threads)
        logits = bench.predict_all(session, self.test.inputs)
        timings = bench.batch_latencies(self.test.inputs, lambda x: lambda: bench.run(session, x),
                                        budget_s=self.options.bench_s)
        threads = self.options.threads
        runtime = f"onnxruntime-cpu ({threads} thread{'s' if threads > 1 else ''})"
        # free the session's threads now: a fine-tuning run next may fork DataLoader workers, and a session
        # destroyed in a forked child can wait forever on a lock a parent thread held at fork time
        del session
        gc.collect()
        return bench.variant_row(name, path, runtime, params, flops, logits, self.test.labels, self.task, reference, timings)


def add_comparisons(variants: list[dict[str, Any]]) -> None:
    """Each row against fp32: size ratio, batch-32 speedup, accuracy change in points."""
    base = next(v for v in variants if v["name"] == "fp32")
    for v in variants:
        v["size_ratio"] = base["bytes"] / v["bytes"]
        v["speedup"] = {k: base["latency_ms"][k] / v["latency_ms"][k] for k in v["latency_ms"] if k in base["latency_ms"]}
        if v.get("accuracy") is not None and base.get("accuracy") is not None:
            v["accuracy_delta_pt"] = 100.0 * (v["accuracy"] - base["accuracy"])


def load_splits(cfg: Any, calibration_samples: int, stored: dict[str, Any]) -> tuple[Split, Split]:
    """The test split, and a seeded random subset of the unaugmented train split for calibration; tokenized by
    the run's stored tokenizer."""
    data = build_data(cfg.data, seed=cfg.seed, stored=stored)
    test = to_arrays(data.test, range(len(data.test)))
    order = np.random.default_rng(cfg.seed).permutation(len(data.train))[:calibration_samples]
    return test, to_arrays(data.train, order)


def to_arrays(dataset: Any, indices: Any) -> Split:
    xs, ys = zip(*(dataset[int(i)] for i in indices))  # integer indices: no augmentation
    return Split(torch.stack(xs).numpy(), torch.stack([torch.as_tensor(y) for y in ys]).numpy())


def torch_logits(model: nn.Module, inputs: np.ndarray, batch_size: int = 256) -> np.ndarray:
    model = model.to("cpu").eval()
    with torch.no_grad():
        return torch.cat([model(torch.from_numpy(inputs[i:i + batch_size])) for i in range(0, len(inputs), batch_size)]).numpy()


def fine_tune(result: PruneResult, teacher: nn.Module, cfg: Any, task: str, run_dir: Path, options: CompressOptions,
              log: Callable[[str], None], observer: Optional[RunObserver] = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train the pruned model through the normal loop (resumable, checkpointed, reported) in `run_dir`."""
    d = cfg.model_dump(mode="json")
    d["name"] = f"{cfg.name}-pruned"
    d["stage"]["pruned"] = True
    d["train"].update(epochs=options.finetune_epochs, max_steps=None)
    d["optim"]["lr"] = cfg.optim.lr * options.finetune_lr_scale
    d["log"]["progress"] = options.progress
    ft_cfg = config_from_dict(d)
    loss = None
    if options.distill:
        loss = distillation_loss(copy.deepcopy(teacher), task=task,
                                 temperature=options.temperature, alpha=options.alpha)
    log(f"fine-tuning the pruned model for {options.finetune_epochs} epoch(s){' with distillation' if loss else ''} in {run_dir}")
    skeleton = result.model
    hooks = FitHooks(build_model=lambda info: copy.deepcopy(skeleton), loss=loss, observer=observer)  # as any run
    # pruning is deterministic, so a rerun rebuilds the same skeleton and continues from the last checkpoint
    trained = train(ft_cfg, run_dir=run_dir, hooks=hooks, resume="auto" if run_dir.exists() else None)
    model = load_trained(run_dir).build_model()  # the pruned architecture, resized to its weights
    summary = {"run_dir": str(run_dir), "epochs": options.finetune_epochs, "steps": trained.steps,
               "lr": ft_cfg.optim.lr, "distill": options.distill, "status": trained.status,
               "temperature": options.temperature if options.distill else None,
               "alpha": options.alpha if options.distill else None}
    return model, summary


def check_out_dir(out_dir: Path) -> bool:
    """True when `out_dir` holds an unfinished compression to continue; False when new or empty.

    A finished one (compress.json, then manifest.json, written last) or any file compress does not write is never touched.
    """
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return False
    if not out_dir.is_dir():
        raise UserError(f"--out: {out_dir} is a file; pass a directory")
    if (out_dir / COMPRESS_RECORD).exists():
        raise UserError(f"--out: {out_dir} holds a finished compression (compress.json); choose another --out or remove it")
    own = set(FILE_NAMES.values()) | {"finetune", "torchao-int8.pt", "torchao-float8.pt"}
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in own and not p.name.endswith(TEMP_SUFFIXES))
    if foreign:
        raise UserError(f"--out: {out_dir} holds files compress did not write ({foreign[0]}); choose another --out")
    return True


def owning_run_dir(source: Path) -> Optional[Path]:
    """The run directory a final/ or checkpoint belongs to (the one with config.yaml and metrics.jsonl)."""
    for candidate in (source, *source.parents[:3]):
        if (candidate / METRICS).is_file() and (candidate / CONFIG).is_file():
            return candidate
    return None
