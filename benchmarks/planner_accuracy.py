"""Planner accuracy: predicted against measured peak memory and step time, side by side.

    .venv/bin/python benchmarks/planner_accuracy.py            # on this machine's device (CPU or GPU)
    .venv/bin/python benchmarks/planner_accuracy.py --json

Memory: the fake-tensor simulation against the same two training iterations on real tensors under
MemTracker (CPU), or against `torch.cuda.max_memory_allocated` / `max_memory_reserved` of real trainer
steps (GPU, where the prediction includes the correction terms). Time: the roofline's uncalibrated
prediction for this device against the median step time of real trainer steps. Prints the ratio
predicted / measured for each case; docs/planner.md keeps the figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import trainforge
from trainforge.config import ModelConfig, OptimConfig
from trainforge.data.base import DataInfo
from trainforge.hardware.catalog import load_catalog
from trainforge.hardware.device import resolve_device
from trainforge.planning.simulate import measure_real_step, simulate_step

DIGITS = DataInfo("classification", "image", (1, 8, 8), "float32", 10, tuple("0123456789"))
TEXT = DataInfo("lm", "text", (128,), "int64", 256, vocab_size=256, seq_len=128)
MEMORY_CASES = [
    ("digits_cnn fp32 b64", ModelConfig(name="cnn", args=dict(channels=[32, 64, 128])), DIGITS, 64, {}),
    ("gpt 2x128 fp32 b8", ModelConfig(name="gpt", args=dict(n_layer=2, n_head=4, n_embd=128)), TEXT, 8, {}),
    ("gpt 2x128 bf16+ckpt b8", ModelConfig(name="gpt", args=dict(n_layer=2, n_head=4, n_embd=128)), TEXT, 8,
     dict(precision="bf16", activation_checkpointing=True)),
    ("gpt 4x256 fp32 b16", ModelConfig(name="gpt", args=dict(n_layer=4, n_head=4, n_embd=256)), TEXT, 16, {}),
]
TIME_CASES = [
    ("digits_cnn", "digits_cnn", []),
    ("charlm_gpt (small corpus)", "charlm_gpt", ["data.args.max_bytes=300000"]),
]
STEPS, WARMUP = 12, 3


def memory_rows() -> list[dict]:
    rows = []
    for name, model_cfg, info, batch, kw in MEMORY_CASES:
        sim = simulate_step(model_cfg, OptimConfig(name="adamw", weight_decay=0.1), info, micro_batch_size=batch, **kw)
        real = measure_real_step(model_cfg, OptimConfig(name="adamw", weight_decay=0.1), info, micro_batch_size=batch, **kw)
        rows.append({"case": name, "predicted_bytes": sim.peak_bytes, "measured_bytes": real,
                     "ratio": sim.peak_bytes / real})
    return rows


def time_rows(device: torch.device) -> list[dict]:
    from trainforge.planning.plan import plan_local_step
    from trainforge.training.run import run
    from trainforge.engine.metrics import read_metrics

    rows = []
    catalog = load_catalog()
    for name, recipe, extra in TIME_CASES:
        cfg = trainforge.load_config(recipe, [*extra, f"train.max_steps={STEPS}", "train.log_every_steps=1",
                                              f"train.eval_every_steps={STEPS}", "train.early_stopping=null",
                                              "log.progress=false", "log.tensorboard=false"])
        with tempfile.TemporaryDirectory() as tmp:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            result = run(cfg, Path(tmp) / "run")
            train = [r for r in read_metrics(Path(tmp) / "run" / "metrics.jsonl") if r["split"] == "train"]
        measured = statistics.median(r["step_time_s"] for r in train[WARMUP:])
        predicted = plan_local_step(cfg, device, catalog, micro_batch_size=result.micro_batch_size,
                                    precision=result.setup.precision, calibration={})
        row = {"case": name, "device": predicted.gpu, "predicted_step_s": predicted.step_time_s,
               "measured_step_s": measured, "ratio": predicted.step_time_s / measured, "bound": predicted.bound}
        if device.type == "cuda":
            row.update(predicted_peak_bytes=predicted.peak_bytes_per_gpu,
                       measured_reserved_bytes=int(torch.cuda.max_memory_reserved(device)),
                       measured_allocated_bytes=int(torch.cuda.max_memory_allocated(device)))
            row["peak_ratio"] = row["predicted_peak_bytes"] / row["measured_reserved_bytes"]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    start = time.perf_counter()
    result = {"device": str(device), "torch": torch.__version__, "memory": memory_rows(), "time": time_rows(device)}
    result["wall_s"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"planner accuracy on {device} (torch {torch.__version__})")
    print(f"{'simulated peak vs MemTracker on real CPU tensors':<48} {'predicted':>12} {'measured':>12} {'ratio':>7}")
    for r in result["memory"]:
        print(f"  {r['case']:<46} {r['predicted_bytes']:>12,} {r['measured_bytes']:>12,} {r['ratio']:>7.3f}")
    print(f"{'step time, uncalibrated roofline vs trainer':<48} {'predicted':>12} {'measured':>12} {'ratio':>7}")
    for r in result["time"]:
        print(f"  {r['case'] + ' on ' + r['device']:<46} {r['predicted_step_s'] * 1e3:>10.2f}ms "
              f"{r['measured_step_s'] * 1e3:>10.2f}ms {r['ratio']:>7.3f}")
        if "peak_ratio" in r:
            print(f"  {'  peak incl. corrections vs reserved':<46} {r['predicted_peak_bytes']:>12,} "
                  f"{r['measured_reserved_bytes']:>12,} {r['peak_ratio']:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
