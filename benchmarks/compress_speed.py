"""int8 and pruning against fp32, side by side: size, CPU latency and accuracy of the compressed variants.

    .venv/bin/python benchmarks/compress_speed.py [--threads 1] [--bench-seconds 2] [--json]

Trains the two target recipes (digits_cnn; textcls_transformer on its full 4000 generated samples) for a
short schedule, runs `trainforge compress --prune 0.5 --distill` on each, and prints for every variant
its size ratio, batch-1 and batch-32 speedup over the fp32 ONNX model (same process, same thread count,
measured one after another) and its accuracy change. Exits 0: a ratio is a measurement, not a test.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import trainforge
from trainforge.compression.pipeline import CompressOptions, compress

TARGETS = {
    "digits_cnn": ["train.epochs=15"],
    "textcls_transformer": ["train.epochs=3"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bench-seconds", type=float, default=2.0)
    parser.add_argument("--finetune-epochs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe, overrides in TARGETS.items():
            print(f"training {recipe} ...", file=sys.stderr)
            run = trainforge.train(recipe, overrides=[*overrides, "log.progress=false", "log.tensorboard=false"],
                                   run_dir=Path(tmp) / recipe).run_dir
            print(f"compressing {recipe} ...", file=sys.stderr)
            doc = compress(run, options=CompressOptions(prune=0.5, finetune_epochs=args.finetune_epochs, distill=True,
                                                        threads=args.threads, bench_s=args.bench_seconds, progress=False))
            results[recipe] = [
                {"name": v["name"], "bytes": v["bytes"], "size_ratio": v["size_ratio"], "speedup_b1": v["speedup"]["b1"],
                 "speedup_b32": v["speedup"]["b32"], "latency_ms": v["latency_ms"], "latency_p90_ms": v["latency_p90_ms"],
                 "accuracy": v["accuracy"], "accuracy_delta_pt": v.get("accuracy_delta_pt")}
                for v in doc["variants"]
            ]
    if args.json:
        print(json.dumps({"threads": args.threads, "results": results}, indent=1))
        return
    for recipe, rows in results.items():
        print(f"\n{recipe} (onnxruntime, {args.threads} thread(s)); ratios against fp32 ONNX")
        print(f"{'variant':<12} {'size':>10} {'smaller':>8} {'b1 ms':>8} {'b1 gain':>8} {'b32 ms':>8} {'b32 gain':>9} {'acc %':>7} {'Δ pt':>6}")
        for r in rows:
            print(f"{r['name']:<12} {r['bytes']:>10,} {r['size_ratio']:>7.2f}x {r['latency_ms']['b1']:>8.3f} "
                  f"{r['speedup_b1']:>7.2f}x {r['latency_ms']['b32']:>8.3f} {r['speedup_b32']:>8.2f}x "
                  f"{100 * r['accuracy']:>7.2f} {r['accuracy_delta_pt']:>+6.2f}")


if __name__ == "__main__":
    main()
