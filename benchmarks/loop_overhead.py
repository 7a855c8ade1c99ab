"""Loop overhead: trainforge's `fit()` against a plain hand-written PyTorch loop doing the same work.

    .venv/bin/python benchmarks/loop_overhead.py                           # table + ratio, about 1 minute
    .venv/bin/python benchmarks/loop_overhead.py --repeats 5 --steps 100 --threads 1 --json

Both sides train the same model (the zoo's `cnn` on 3x32x32 images, fp32, CPU, AdamW at a constant
LR, no clipping, no EMA) from the same seed on the same in-memory tensors, with the same thread
count and no DataLoader workers. trainforge runs through `fit()` unmodified: its data comes from a
`custom` source (this file's `synthetic_arrays`) and its step times are the `step_time_s` of its
metrics.jsonl rows, one row per window of 10 steps. The plain loop is timed the same way: a
perf_counter around each 10 steps, divided by 10. The first window of every run is warm-up and is
dropped. R repeats alternate which side goes first (trainforge in repeats 1, 3, 5, ...), so slow
drifts of the machine hit both sides alike. Printed: a per-repeat table and
ratio = median(trainforge window step times) / median(plain window step times). The goal is <= 1.05.
Always exits 0: the ratio is a measurement, not a test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainforge.config import Config, config_from_dict
from trainforge.data import build_data
from trainforge.data.base import DataInfo
from trainforge.hardware.cpus import available_cpus
from trainforge.models import build_model
from trainforge.training.run import run
from trainforge.engine.metrics import read_metrics

WINDOW_STEPS = 10  # = train.log_every_steps: one metrics row, one plain-loop timing window
GOAL_RATIO = 1.05
IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10
NOISY_SPREAD = 0.10  # a quiet machine gives window times within a few percent of each other
VAL_FRACTION = TEST_FRACTION = 0.05  # fit() evaluates and tests once at the end; keep that small


def synthetic_arrays(num_samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `custom` data factory trainforge loads by `data.target`: standard-normal images, random labels.

    Already zero-mean unit-variance, so `data.normalize: none` leaves trainforge's per-sample path
    as bare indexing, like the plain loop's TensorDataset.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, *IMAGE_SHAPE, generator=g)
    y = torch.randint(0, NUM_CLASSES, (num_samples,), generator=g)
    return x, y


def bench_config(
    *, steps: int, batch_size: int, channels: list[int], threads: int, seed: int, lr: float
) -> Config:
    """One run of `steps` optimizer steps, all within the first epoch; eval and checkpoint only at the end."""
    train_fraction = 1 - VAL_FRACTION - TEST_FRACTION
    num_samples = int(steps * batch_size / train_fraction) + 4 * batch_size  # margin for split rounding
    return config_from_dict({
        "name": "loop_overhead",
        "seed": seed,
        "data": {
            "source": "custom",
            "target": f"{Path(__file__).stem}:synthetic_arrays",
            "args": {"num_samples": num_samples, "seed": seed},
            "val_fraction": VAL_FRACTION,
            "test_fraction": TEST_FRACTION,
            "normalize": "none",
            "num_workers": 0,
        },
        "model": {"name": "cnn", "args": {"channels": channels, "dropout": 0.1}},
        "optim": {"name": "adamw", "lr": lr, "weight_decay": 0.0},
        "schedule": {"name": "constant", "warmup_steps": 0},
        "train": {
            "max_steps": steps,
            "global_batch_size": batch_size,
            "micro_batch_size": batch_size,
            "precision": "fp32",
            "device": "cpu",
            "compile": False,
            "grad_clip_norm": None,
            "ema_decay": None,
            "eval_every_steps": steps,
            "checkpoint_every_steps": steps,
            "keep_checkpoints": 1,
            "log_every_steps": WINDOW_STEPS,
            "num_threads": threads,
        },
        "log": {"progress": False, "tensorboard": False},
    })


def train_split(cfg: Config) -> tuple[DataInfo, torch.Tensor, torch.Tensor]:
    """The exact train split fit() will see (same source, split and seed), as two stacked tensors."""
    bundle = build_data(cfg.data, seed=cfg.seed)
    pairs = [bundle.train[i] for i in range(len(bundle.train))]
    return bundle.info, torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def run_trainforge(cfg: Config) -> tuple[list[float], float]:
    """fit() in a throwaway run dir -> (step time of each window after the first, mean train loss)."""
    with tempfile.TemporaryDirectory(prefix="loop_overhead-") as tmp:
        run_dir = Path(tmp) / "run"
        run(cfg, run_dir)
        rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"]
    return [r["step_time_s"] for r in rows[1:]], statistics.fmean(r["loss"] for r in rows)


def run_plain(
    info: DataInfo, x: torch.Tensor, y: torch.Tensor, *, cfg: Config
) -> tuple[list[float], float]:
    """The hand-written loop a user would write, timed in windows of WINDOW_STEPS steps."""
    steps, batch_size = cfg.train.max_steps, cfg.train.global_batch_size
    torch.manual_seed(cfg.seed)
    model, _ = build_model(cfg.model, info)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=0.0)
    loader = DataLoader(
        TensorDataset(x, y), batch_size=batch_size, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    assert len(loader) >= steps, "bench_config sizes the data so that a run fits in one epoch"
    window_s: list[float] = []
    loss_sum = 0.0
    start = time.perf_counter()
    for step, (xb, yb) in enumerate(loader):
        if step == steps:
            break
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item()  # a real loop reads its loss to report it; trainforge does too
        if (step + 1) % WINDOW_STEPS == 0:
            now = time.perf_counter()
            window_s.append((now - start) / WINDOW_STEPS)
            start = now
    return window_s[1:], loss_sum / steps


def measure(
    *, repeats: int, steps: int, batch_size: int, channels: list[int], threads: int, seed: int, lr: float
) -> dict[str, Any]:
    """Interleaved repeats of both loops; returns the JSON-able result (see `main`)."""
    torch.set_num_threads(threads)  # fit() sets train.num_threads itself and restores this after
    cfg = bench_config(steps=steps, batch_size=batch_size, channels=channels, threads=threads, seed=seed, lr=lr)
    info, x, y = train_split(cfg)
    all_tf: list[float] = []
    all_plain: list[float] = []
    per_repeat: list[dict[str, Any]] = []
    for r in range(repeats):
        first = "trainforge" if r % 2 == 0 else "plain"
        results: dict[str, tuple[list[float], float]] = {}
        for side in (["trainforge", "plain"] if first == "trainforge" else ["plain", "trainforge"]):
            t0 = time.perf_counter()
            results[side] = run_trainforge(cfg) if side == "trainforge" else run_plain(info, x, y, cfg=cfg)
            log(f"repeat {r + 1}/{repeats} {side:<10} {time.perf_counter() - t0:6.1f} s wall, "
                f"median step {statistics.median(results[side][0]) * 1e3:.2f} ms")
        (tf_s, tf_loss), (plain_s, plain_loss) = results["trainforge"], results["plain"]
        all_tf += tf_s
        all_plain += plain_s
        per_repeat.append({
            "repeat": r + 1,
            "first": first,
            "trainforge_median_step_s": statistics.median(tf_s),
            "plain_median_step_s": statistics.median(plain_s),
            "ratio": statistics.median(tf_s) / statistics.median(plain_s),
            "trainforge_mean_loss": tf_loss,
            "plain_mean_loss": plain_loss,
        })
    tf_median, plain_median = statistics.median(all_tf), statistics.median(all_plain)
    spread = {"trainforge": relative_iqr(all_tf), "plain": relative_iqr(all_plain)}
    return {
        "benchmark": "loop_overhead",
        "ratio": tf_median / plain_median,
        "goal_ratio": GOAL_RATIO,
        "meets_goal": tf_median / plain_median <= GOAL_RATIO,
        "trainforge_median_step_s": tf_median,
        "plain_median_step_s": plain_median,
        "overhead_per_step_s": tf_median - plain_median,
        "windows_per_side": len(all_tf),
        # interquartile range of the window step times / their median: above NOISY_SPREAD the machine was busy
        "relative_iqr": spread,
        "noisy": max(spread.values()) > NOISY_SPREAD,
        "repeats": per_repeat,
        "setup": {
            "model": "cnn (dropout 0.1)",
            "channels": channels,
            "input": list(IMAGE_SHAPE),
            "num_classes": NUM_CLASSES,
            "batch_size": batch_size,
            "steps_per_run": steps,
            "window_steps": WINDOW_STEPS,
            "threads": threads,
            "precision": "fp32",
            "optimizer": f"adamw lr={lr} weight_decay=0, constant lr, no clipping",
            "train_samples": len(x),
        },
        "machine": {
            "cpus": available_cpus(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "date": datetime.date.today().isoformat(),
    }


def relative_iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / statistics.median(values)


def render(result: dict[str, Any]) -> str:
    """The human-readable table."""
    s = result["setup"]
    lines = [
        f"loop overhead: cnn {s['channels']} on {'x'.join(map(str, s['input']))}, batch {s['batch_size']}, fp32 CPU, "
        f"{s['threads']} thread(s), {s['steps_per_run']} steps per run, torch {result['machine']['torch']}",
        "",
        f"{'repeat':>6}  {'first':<10}  {'trainforge ms':>13}  {'plain ms':>9}  {'ratio':>6}  {'loss tf/plain':>13}",
    ]
    for r in result["repeats"]:
        lines.append(
            f"{r['repeat']:>6}  {r['first']:<10}  {r['trainforge_median_step_s'] * 1e3:>13.2f}  "
            f"{r['plain_median_step_s'] * 1e3:>9.2f}  {r['ratio']:>6.3f}  "
            f"{r['trainforge_mean_loss']:>6.3f}/{r['plain_mean_loss']:<6.3f}"
        )
    verdict = "meets" if result["meets_goal"] else "MISSES"
    lines += [
        "",
        f"median step time over {result['windows_per_side']} windows per side: "
        f"trainforge {result['trainforge_median_step_s'] * 1e3:.2f} ms, plain {result['plain_median_step_s'] * 1e3:.2f} ms",
        f"spread (IQR / median): trainforge {result['relative_iqr']['trainforge']:.1%}, "
        f"plain {result['relative_iqr']['plain']:.1%}",
        f"ratio {result['ratio']:.3f} ({verdict} the goal <= {result['goal_ratio']})",
    ]
    if result["noisy"]:
        lines.append(f"note: spread above {NOISY_SPREAD:.0%}: other processes were competing for the CPU; "
                     "rerun when the machine is quiet before trusting the ratio")
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 32,64,128, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="interleaved trainforge/plain pairs (default 5)")
    p.add_argument("--steps", type=int, default=100,
                   help=f"optimizer steps per run, a multiple of {WINDOW_STEPS}, at least {2 * WINDOW_STEPS} (default 100)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads, both sides (default 1: steadier on a small shared box)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32)")
    p.add_argument("--channels", type=_int_list, default=[32, 64, 128],
                   help="cnn stage widths, comma-separated (default 32,64,128); small widths expose the fixed per-step cost")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout instead of the table")
    args = p.parse_args(argv)
    if args.steps < 2 * WINDOW_STEPS or args.steps % WINDOW_STEPS:
        p.error(f"--steps: need a multiple of {WINDOW_STEPS} that is at least {2 * WINDOW_STEPS} "
                f"(the first window is warm-up), got {args.steps}")
    for name in ("repeats", "threads", "batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # fit() imports the data factory by name ("loop_overhead:synthetic_arrays") from this folder
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    result = measure(
        repeats=args.repeats, steps=args.steps, batch_size=args.batch_size, channels=args.channels,
        threads=args.threads, seed=args.seed, lr=1e-3,
    )
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
