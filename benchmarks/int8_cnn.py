"""Static int8 against fp32 on a small image CNN: which quantization settings make onnxruntime faster.

    .venv/bin/python benchmarks/int8_cnn.py [--image-size 32] [--channels 16,32,64] [--in-channels 1] [--rounds 5] [--json]

Trains the zoo `cnn` briefly on `synthetic_images` (grayscale 32x32, 10 classes by default), exports it with
trainforge's exporter and quantizes it with `trainforge.compression.quantize` under several settings: the
default (stem convolution kept float), the previous default (every Conv int8), per-tensor weights, uint8
activations, the QOperator format. Every file is timed with 1 onnxruntime thread at batch 1 and 32, the
variants interleaved over `--rounds` rounds (the median of the round medians), in one process, and checked
on the test split. Prints each setting's latency, speedup over fp32 and accuracy (and a note when the rounds
spread over 10%); with --json one document whose top-level "ratio" is the default int8's batch-32 speedup over
fp32. Exits 0: a ratio is a measurement. Figures and what they mean: docs/deploy.md ("When int8 helps").
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import trainforge
from trainforge.compression import bench
from trainforge.compression.artifact import artifact_meta
from trainforge.compression.export import export_onnx
from trainforge.compression.pipeline import load_splits
from trainforge.compression.quantize import StaticInt8, quantize_onnx
from trainforge.config import config_from_dict, load_config
from trainforge.training.artifacts import load_trained

SETTINGS = {
    "int8 (default: float stem)": StaticInt8(),
    "int8, every Conv (previous default)": StaticInt8(float_conv_channels=0),
    "int8, every Conv, per-tensor": StaticInt8(float_conv_channels=0, per_channel=False),
    "int8, every Conv, uint8 activations": StaticInt8(float_conv_channels=0, activations="uint8"),
    "int8, every Conv, QOperator": StaticInt8(float_conv_channels=0, format="qoperator"),
    "int8, float stem, per-tensor": StaticInt8(per_channel=False),
}


def train(run_dir: Path, image_size: int, in_channels: int, channels: list[int], epochs: int) -> Path:
    cfg = load_config("digits_cnn", [f"train.epochs={epochs}", "log.progress=false", "log.tensorboard=false"])
    d = cfg.model_dump(mode="json")
    d["name"] = "int8-cnn"
    d["data"] = {"source": "synthetic_images", "normalize": "zscore", "val_fraction": 0.15, "test_fraction": 0.2,
                 "args": {"num_samples": 2000, "image_size": image_size, "channels": in_channels, "num_classes": 10}}
    d["model"]["args"] = {"channels": channels, "dropout": 0.1}
    trainforge.train(config_from_dict(d), run_dir=run_dir)
    return run_dir


def cpu_name() -> str:
    """The CPU model and whether it has VNNI (int8 dot products), which decides much of int8's speed."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 platform.machine())
    return f"{model} ({'VNNI' if 'avx512_vnni' in info or 'avx_vnni' in info else 'no VNNI'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--in-channels", type=int, default=1)
    parser.add_argument("--channels", default="16,32,64")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.4, help="timing budget per file, batch size and round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    channels = [int(c) for c in args.channels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("training ...", file=sys.stderr)
        run = train(root / "run", args.image_size, args.in_channels, channels, args.epochs)
        trained = load_trained(run)
        test, calibration = load_splits(trained.config, 256)
        model = trained.build_model().eval()
        meta = artifact_meta("fp32", trained.info, trained.preprocess)
        files = {"fp32": export_onnx(model, torch.from_numpy(test.inputs[:2]), root / "fp32.onnx", meta)}
        batches = [calibration.inputs[i:i + 32] for i in range(0, len(calibration.inputs), 32)]
        for i, (name, static) in enumerate(SETTINGS.items()):
            print(f"quantizing: {name}", file=sys.stderr)
            files[name] = quantize_onnx(files["fp32"], root / f"q{i}.onnx", "static", {**meta, "variant": "int8"},
                                        calibration=batches, static=static)
        sessions = {name: bench.ort_session(path, 1) for name, path in files.items()}
        accuracy = {name: float((bench.predict_all(s, test.inputs).argmax(1) == test.labels).mean())
                    for name, s in sessions.items()}
        runs: dict[str, dict[int, list[float]]] = {name: {1: [], 32: []} for name in files}
        for r in range(args.rounds):
            print(f"timing round {r + 1}/{args.rounds}", file=sys.stderr)
            for b in (1, 32):
                x = np.ascontiguousarray(np.concatenate([test.inputs] * 2)[:b])
                for name, s in sessions.items():
                    runs[name][b].append(bench.latency_ms(lambda: bench.run(s, x), budget_s=args.seconds)["median"])
        rows = []
        for name in files:
            ms = {b: float(np.median(runs[name][b])) for b in (1, 32)}
            rows.append({"name": name, "bytes": files[name].stat().st_size, "b1_ms": ms[1], "b32_ms": ms[32],
                         "speedup_b1": float(np.median(runs["fp32"][1])) / ms[1],
                         "speedup_b32": float(np.median(runs["fp32"][32])) / ms[32], "accuracy": accuracy[name],
                         # (slowest - fastest round) / median: above 0.1, other processes were competing
                         "spread_b32": float(np.ptp(runs[name][32])) / ms[32]})
    default = next(r for r in rows if r["name"].startswith("int8 (default"))
    model_desc = f"cnn {args.channels} on {args.in_channels}x{args.image_size}x{args.image_size}"
    if args.json:
        print(json.dumps({"ratio": default["speedup_b32"], "model": model_desc, "cpu": cpu_name(), "threads": 1,
                          "rows": rows}, indent=1))
        return
    print(f"\n{model_desc}; onnxruntime, 1 thread; {cpu_name()}")
    print(f"{'variant':<38} {'bytes':>8} {'b1 ms':>7} {'b1 gain':>8} {'b32 ms':>7} {'b32 gain':>9} {'acc %':>7}")
    for r in rows:
        print(f"{r['name']:<38} {r['bytes']:>8,} {r['b1_ms']:>7.3f} {r['speedup_b1']:>7.2f}x {r['b32_ms']:>7.3f} "
              f"{r['speedup_b32']:>8.2f}x {100 * r['accuracy']:>7.2f}")
    noisy = [r["name"] for r in rows if r["spread_b32"] > 0.10]
    if noisy:
        print(f"note: batch-32 rounds spread over 10% for {', '.join(noisy)}: other processes were competing; rerun")


if __name__ == "__main__":
    main()
