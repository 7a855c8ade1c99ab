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
from trainforge.compression.recommend import batch_key, mark
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
from trainforge.tasks import Task, task_of

TEMP_SUFFIXES = (".export.onnx", ".prep.onnx", ".q.onnx")  # left by a crash mid-export or mid-quantization


@dataclass
class Split:
    """One split the way the exported model takes it (`feeds`: {ONNX input name: array}) and as the task batches it
    (`batch`: its collate of every sample, which the task scores outputs against)."""

    feeds: dict[str, np.ndarray]
    batch: Any
    task: Task

    @property
    def inputs(self) -> np.ndarray:
        """The one input of a model of one input (torchao's PyTorch variants take it)."""
        (x,) = self.feeds.values()
        return x

    @property
    def labels(self) -> np.ndarray:
        return self.task.target(self.batch).cpu().numpy()

    def __len__(self) -> int:
        return len(next(iter(self.feeds.values())))

    def chunks(self, size: int) -> list[dict[str, np.ndarray]]:
        return [{k: v[i:i + size] for k, v in self.feeds.items()} for i in range(0, len(self), size)]


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
    task = task_of(info)
    if task.export_refusal is not None:
        raise UserError(f"{checkpoint}: a {task.name} model; {task.export_refusal}")
    if options.distill and task.distill_refusal is not None:
        raise UserError(f"--distill: {task.distill_refusal}")
    signature = task.export_signature(info)
    test, calibration = load_splits(cfg, options.calibration_samples, trained.preprocess, task, info)
    model = trained.build_model().eval()
    exported = task.export_module(model, info)  # what the graph holds: the model, or the task's wrapper of it
    # the example is a training-split sample: the shape the model takes (a task may infer on larger test inputs);
    # two samples, as a batch of one would fix the graph's batch at 1 (unless the task's graph takes a fixed batch)
    graph_batch = task.export_batch_size
    two = task.export_example(bench.batch_of(calibration.feeds, graph_batch or 2), info)
    example = tuple(torch.from_numpy(two[name]) for name in signature.inputs)

    def meta(variant: str) -> dict[str, Any]:
        return artifact_meta(variant, info, trained.preprocess)

    teacher = torch_outputs(exported, test, task, signature, meta("fp32"))
    out_dir.mkdir(parents=True, exist_ok=True)

    flops, params = count(exported, example if len(example) > 1 else example[0])
    variants: list[dict[str, Any]] = []
    measure = Measurer(test, task, info, options, log, meta("fp32"))
    log("exporting fp32 ONNX")
    fp32 = export_onnx(exported, example, out_dir / FILE_NAMES["fp32"], meta("fp32"), signature)
    variants.append(measure("fp32", fp32, params, flops, reference=teacher))

    pruning: Optional[dict[str, Any]] = None
    finetune: Optional[dict[str, Any]] = None
    pruned_path: Optional[Path] = None
    result: Optional[PruneResult] = None
    if options.prune > 0:
        log(f"pruning {options.prune:.0%} of each prunable width")
        try:
            if len(example) > 1 or exported is not model:
                raise PruningUnsupported(f"--prune: prunes models of one input that are exported as they are; a "
                                         f"{task.name} model is not: pruning skipped (use --prune 0)")
            result = prune_model(model, example[0], options.prune)
        except PruningUnsupported as e:  # one line; the other variants are still written
            log(f"warning: {e}")
            pruning = {"ratio": options.prune, "skipped": str(e)}
    if result is not None:
        pruning = {k: v for k, v in dataclasses.asdict(result).items() if k != "model"}
        pruned_model = result.model
        if options.finetune_epochs > 0:
            pruned_model, finetune = fine_tune(result, model, cfg, task, out_dir / "finetune", options, log,
                                               observer)
        pruned_model.eval()
        pruned_path = export_onnx(pruned_model, example, out_dir / FILE_NAMES["pruned"], meta("pruned"), signature)
        pruned_logits = torch_outputs(pruned_model, test, task, signature, meta("pruned"))
        variants.append(measure("pruned", pruned_path, result.params_after, result.flops_after, reference=pruned_logits))

    method = None
    if options.quantize == "int8":
        method = choose_method(exported, example) if options.int8_method == "auto" else options.int8_method
        batches = [task.graph_feeds(chunk, info) for chunk in calibration.chunks(graph_batch or 32)]
        sources = [("int8", fp32, params, flops, teacher)]
        if pruned_path is not None:
            sources.append(("pruned+int8", pruned_path, pruning["params_after"], pruning["flops_after"], pruned_logits))
        for name, src, n_params, n_flops, reference in sources:
            log(f"quantizing {src.name} to int8 ({method})")
            path = quantize_onnx(src, out_dir / FILE_NAMES[name], method, meta(name), calibration=batches)
            variants.append(measure(name, path, n_params, n_flops, reference=reference))
    elif options.quantize.startswith("torchao"):
        log(f"quantizing Linear weights with {options.quantize}")
        variants.append(torchao_variant(model, options.quantize, test, only(teacher), out_dir, params, flops,
                                        info.task, options.bench_s, options.device))

    add_comparisons(variants)
    # the tolerance counts points of the task's quality where it is a fraction to maximize (accuracy, mAP@.5, mIoU)
    points = task.quality[0] if task.direction(task.quality[0]) == "max" else "accuracy"
    served = batch_key(task.served_batch)  # the latency a user gets: batch 1 for a task served image by image
    choice = mark(variants, options.accuracy_tolerance_pt, points, served)
    log(f"recommended: {choice.reason}")
    doc = {
        "checkpoint": str(trained.source),
        "out": str(out_dir),
        "task": info.task,
        "threads": options.threads,
        "int8_method": method,
        "pruning": pruning,
        "finetune": finetune,
        "test_samples": len(test),
        "variants": variants,
        "recommendation": {"variant": choice.name, "file": FILE_NAMES[choice.name], "reason": choice.reason,
                           "accuracy_tolerance_pt": options.accuracy_tolerance_pt, "points": points,
                           "batch": served},
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
    """One row of the table per ONNX variant: size, the task's test metrics, agreement with PyTorch, latency."""

    def __init__(self, test: Split, task: Task, info: Any, options: CompressOptions, log: Callable[[str], None],
                 meta: dict[str, Any]) -> None:
        self.test, self.task, self.info, self.options, self.log, self.meta = test, task, info, options, log, meta

    def __call__(self, name: str, path: Path, params: int, flops: int, reference: dict[str, np.ndarray]) -> dict[str, Any]:
        self.log(f"measuring {name}: test split, latency at batch {', '.join(map(str, bench.BENCH_BATCHES))}")
        session = bench.ort_session(path, self.options.threads)
        names = list(self.task.export_signature(self.info).outputs)

        def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return dict(zip(names, session.run(names, feeds)))

        outputs = served_outputs(run, self.test, self.task, self.meta)
        timings = bench.batch_latencies(self.test.feeds, lambda x: lambda: self.task.serve(run, x, self.meta),
                                        budget_s=self.options.bench_s)
        threads = self.options.threads
        runtime = f"onnxruntime-cpu ({threads} thread{'s' if threads > 1 else ''})"
        # free the session's threads now: a fine-tuning run next may fork DataLoader workers, and a session
        # destroyed in a forked child can wait forever on a lock a parent thread held at fork time
        del session, run
        gc.collect()
        scores = self.task.score_outputs(outputs, self.test.batch, self.info)
        return bench.scored_row(name, path, runtime, params, flops, scores, max_abs_diff(outputs, reference), timings)


def served_outputs(run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], split: Split, task: Task,
                   meta: dict[str, Any], batch_size: int = 256) -> dict[str, np.ndarray]:
    """The outputs for every sample of `split`, inferred as predict infers (the task's `serve` over `run`)."""
    parts = [task.serve(run, feeds, meta) for feeds in split.chunks(batch_size)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def torch_outputs(module: nn.Module, split: Split, task: Task, signature: Any, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """What the exported graph should give on `split`: the PyTorch module it was exported from, served the same way."""
    module = module.to("cpu").eval()

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(feeds[name]) for name in signature.inputs))
        out = out if isinstance(out, (tuple, list)) else (out,)
        return {name: o.numpy() for name, o in zip(signature.outputs, out)}

    return served_outputs(run, split, task, meta)


def max_abs_diff(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """The largest difference between an artifact's outputs and the PyTorch model's, over every output."""
    return max(float(np.abs(outputs[k].astype(np.float64) - reference[k].astype(np.float64)).max()) for k in outputs)


def only(outputs: dict[str, np.ndarray]) -> np.ndarray:
    (x,) = outputs.values()
    return x


def add_comparisons(variants: list[dict[str, Any]]) -> None:
    """Each row against fp32: size ratio, batch-32 speedup, accuracy change in points."""
    base = next(v for v in variants if v["name"] == "fp32")
    for v in variants:
        v["size_ratio"] = base["bytes"] / v["bytes"]
        v["speedup"] = {k: base["latency_ms"][k] / v["latency_ms"][k] for k in v["latency_ms"] if k in base["latency_ms"]}
        if v.get("accuracy") is not None and base.get("accuracy") is not None:
            v["accuracy_delta_pt"] = 100.0 * (v["accuracy"] - base["accuracy"])


def load_splits(cfg: Any, calibration_samples: int, stored: dict[str, Any], task: Task, info: Any) -> tuple[Split, Split]:
    """The test split, and a seeded random subset of the unaugmented train split for calibration; tokenized by
    the run's stored tokenizer."""
    data = build_data(cfg.data, seed=cfg.seed, stored=stored)
    test = to_split(data.test, range(len(data.test)), task, info)
    order = np.random.default_rng(cfg.seed).permutation(len(data.train))[:calibration_samples]
    return test, to_split(data.train, order, task, info)


def to_split(dataset: Any, indices: Any, task: Task, info: Any) -> Split:
    batch = task.collator(info, train=False)([dataset[int(i)] for i in indices])  # integer indices: no augmentation
    return Split(task.export_feeds(batch, info), batch, task)


def torch_logits(model: nn.Module, inputs: np.ndarray, batch_size: int = 256) -> np.ndarray:
    model = model.to("cpu").eval()
    with torch.no_grad():
        return torch.cat([model(torch.from_numpy(inputs[i:i + batch_size])) for i in range(0, len(inputs), batch_size)]).numpy()


def fine_tune(result: PruneResult, teacher: nn.Module, cfg: Any, task: Task, run_dir: Path, options: CompressOptions,
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
        loss = distillation_loss(copy.deepcopy(teacher), task, temperature=options.temperature, alpha=options.alpha)
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
