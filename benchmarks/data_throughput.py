"""Data throughput: images/s from a JPEG folder through trainforge's train loader against torchvision's ImageFolder
+ DataLoader, and the start-up cost of each (trainforge's first scan and its cached one against torchvision's
listing); and the same images as WebDataset shards (`data.source: webdataset`) through trainforge's loader.

    .venv/bin/python benchmarks/data_throughput.py                                  # table + ratio
    .venv/bin/python benchmarks/data_throughput.py --images 2000 --size 256 --image-size 64 --workers 2 --json

The folder is generated here, in a temporary directory, from `--seed`: `--images` JPEGs (quality 90) of
`--size` x `--size` over `--classes` class folders, smooth colour fields plus noise, like photos in size on disk.
trainforge reads it as `data.source: imagefolder` (image_size `--image-size`, zscore, no augmentation) through
`make_train_loader` (its position sampler, `--workers` persistent workers); torchvision reads the same folder
with `datasets.ImageFolder` and the same per-sample work (Pillow RGB, bilinear resize to `--image-size`, to
float in [0, 1], normalize with trainforge's fitted mean and std) through a `DataLoader` with the same batch
size, workers and persistence, shuffled. Each round reads `--batches` batches of each side, alternating which
goes first; the first batch of a round (workers starting) is not timed. Printed: images/s of each side (median
over rounds) and ratio = trainforge / torchvision (goal >= 1.0).

Start-up, each in a fresh TRAINFORGE_HOME: torchvision's `ImageFolder(root)` (a listing); trainforge's
`folder_manifest` the first time (reads and hashes every file, in a process pool) and the second time (a
listing checked against the manifest; goal within 2x torchvision's listing); and `build_data` first and cached,
which also fits the normalization statistics on a seeded sample of up to 2,000 train images.

WebDataset: `trainforge data prepare --format webdataset` of the same folder (timed: `webdataset_prepare_s`,
`--shard-samples` a shard), then `data.source: webdataset` (`webdataset_build_data_s`: no scan, index.json only)
read by the same loader with its shard sampler, in the same rounds (`webdataset_ratio` = its images/s over
torchvision's).
Always exits 0: the ratio is a measurement, not a test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benchmarks: one spread measure for all
from loop_overhead import relative_iqr  # noqa: E402

GOAL_RATIO = 1.0
GOAL_STARTUP_FACTOR = 2.0  # cached scan within this factor of torchvision's listing
NOISY_SPREAD = 0.10


def make_folder(root: Path, *, images: int, size: int, classes: int, seed: int) -> None:
    """`images` JPEGs, round-robin over `classes` folders: a smooth random colour field plus noise each."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for i in range(images):
        c = rng.uniform(0, 255, (3, 3)).astype(np.float32)  # per channel: base, x slope, y slope
        field = c[:, 0, None, None] * 0.5 + c[:, 1, None, None] * xx * 0.5 + c[:, 2, None, None] * yy * 0.5
        arr = np.clip(field.transpose(1, 2, 0) + rng.normal(0, 12, (size, size, 3)), 0, 255).astype(np.uint8)
        folder = root / f"class_{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(arr).save(folder / f"{i:07d}.jpg", quality=90)


def data_config(root: Path, image_size: int, workers: int, source: str = "imagefolder") -> Any:
    from trainforge.config import DataConfig

    return DataConfig(source=source, path=str(root), args={"image_size": image_size}, normalize="zscore",
                      val_fraction=0.05, test_fraction=0.05, num_workers=workers)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def startup(root: Path, image_size: int, workers: int) -> dict[str, float]:
    """Seconds to get ready: torchvision's listing; trainforge's scan, first and cached; build_data, first and cached."""
    from torchvision.datasets import ImageFolder

    from trainforge.data import build_data
    from trainforge.data.formats.manifest import folder_manifest

    out: dict[str, float] = {}
    out["torchvision_listing_s"], _ = timed(lambda: ImageFolder(str(root)))
    for what in ("scan", "build_data"):
        with tempfile.TemporaryDirectory(prefix="data_throughput-home-") as home:
            os.environ["TRAINFORGE_HOME"] = home
            run = (lambda: folder_manifest(root)) if what == "scan" else (
                lambda: build_data(data_config(root, image_size, workers), seed=0))
            out[f"trainforge_{what}_first_s"], _ = timed(run)
            out[f"trainforge_{what}_cached_s"], _ = timed(run)
    return out


class TorchvisionSide:
    """ImageFolder + DataLoader doing trainforge's per-sample work (see the module docstring)."""

    def __init__(self, root: Path, *, image_size: int, mean: list[float], std: list[float], batch_size: int,
                 workers: int, seed: int) -> None:
        from torchvision import transforms
        from torchvision.datasets import ImageFolder

        tf = transforms.Compose([
            transforms.Resize((image_size, image_size), interpolation=transforms.InterpolationMode.BILINEAR),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ])
        dataset = ImageFolder(str(root), transform=tf)
        self.loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=workers,
                                 persistent_workers=workers > 0, generator=torch.Generator().manual_seed(seed))


class TrainforgeSide:
    """trainforge's train loader (`TrainBatches`: the position sampler, or the shard sampler for webdataset)."""

    def __init__(self, root: Path, *, image_size: int, batch_size: int, workers: int, seed: int,
                 source: str = "imagefolder") -> None:
        from trainforge.data import build_data
        from trainforge.data.stages.loader import TrainBatches

        self.bundle = build_data(data_config(root, image_size, workers, source), seed=seed)
        self.batches = TrainBatches(self.bundle.train, seed=seed, micro_batch_size=batch_size,
                                    global_batch_size=batch_size, num_workers=workers, pin_memory=False)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.batches.sampler)

    def iterate(self):
        self.epoch += 1
        return self.batches.at(self.epoch - 1, 0)


def prepare_webdataset(root: Path, out: Path, image_size: int, workers: int, shard_samples: int) -> float:
    """Seconds to write `root` as WebDataset shards in `out` (`trainforge data prepare --format webdataset`)."""
    from trainforge.data.prepare import prepare_data

    seconds, _ = timed(lambda: prepare_data(data_config(root, image_size, workers), seed=0, data_format="webdataset",
                                            out=out, shard_samples=shard_samples))
    return seconds


def images_per_s(batches: Any, count: int) -> float:
    """Read `count` batches (the first one, workers warming up, untimed); images per second of the others."""
    it = iter(batches)
    next(it)
    start, seen = time.perf_counter(), 0
    for _ in range(count - 1):
        x, _ = next(it)
        seen += len(x)
    return seen / (time.perf_counter() - start)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(1)  # the loaders' work is Pillow and small tensors; workers are the parallelism
    with tempfile.TemporaryDirectory(prefix="data_throughput-") as tmp:
        root = Path(tmp) / "images"
        t0 = time.perf_counter()
        make_folder(root, images=args.images, size=args.size, classes=args.classes, seed=args.seed)
        log(f"generated {args.images:,} JPEGs of {args.size}x{args.size} in {time.perf_counter() - t0:.1f} s")
        start = startup(root, args.image_size, args.workers)
        log("start-up: " + ", ".join(f"{k} {v:.3f}" for k, v in start.items()))
        with tempfile.TemporaryDirectory(prefix="data_throughput-home-") as home:
            os.environ["TRAINFORGE_HOME"] = home
            tf = TrainforgeSide(root, image_size=args.image_size, batch_size=args.batch_size, workers=args.workers,
                                seed=args.seed)
            norm = tf.bundle.preprocess["normalize"]
            tv = TorchvisionSide(root, image_size=args.image_size, mean=norm["mean"], std=norm["std"],
                                 batch_size=args.batch_size, workers=args.workers, seed=args.seed)
            shards = Path(tmp) / "shards"
            start["webdataset_prepare_s"] = prepare_webdataset(root, shards, args.image_size, args.workers,
                                                               args.shard_samples)
            start["webdataset_build_data_s"], wds = timed(lambda: TrainforgeSide(
                shards, image_size=args.image_size, batch_size=args.batch_size, workers=args.workers, seed=args.seed,
                source="webdataset"))
            log(f"webdataset: prepared in {start['webdataset_prepare_s']:.2f} s, build_data "
                f"{start['webdataset_build_data_s']:.3f} s")
            batches = min(args.batches, len(tf), len(tv.loader), len(wds))
            loaders = {"trainforge": tf.iterate, "torchvision": lambda: tv.loader, "webdataset": wds.iterate}
            rounds: list[dict[str, Any]] = []
            for r in range(args.rounds):
                order = ["trainforge", "torchvision", "webdataset"]
                order = order[r % 3:] + order[: r % 3]
                row: dict[str, Any] = {"round": r + 1, "first": order[0]}
                for side in order:
                    it = loaders[side]()
                    row[f"{side}_images_per_s"] = images_per_s(it, batches)
                    log(f"round {r + 1}/{args.rounds} {side:<11} {row[f'{side}_images_per_s']:8.1f} images/s")
                rounds.append(row)
    tf_ips = statistics.median(r["trainforge_images_per_s"] for r in rounds)
    tv_ips = statistics.median(r["torchvision_images_per_s"] for r in rounds)
    wds_ips = statistics.median(r["webdataset_images_per_s"] for r in rounds)
    spread = {side: relative_iqr([r[f"{side}_images_per_s"] for r in rounds])
              for side in ("trainforge", "torchvision", "webdataset")}
    startup_factor = start["trainforge_scan_cached_s"] / max(start["torchvision_listing_s"], 1e-9)
    return {
        "benchmark": "data_throughput",
        "ratio": tf_ips / tv_ips,
        "goal_ratio": GOAL_RATIO,
        "meets_goal": tf_ips / tv_ips >= GOAL_RATIO,
        "images_per_s": {"trainforge": tf_ips, "torchvision": tv_ips, "webdataset": wds_ips},
        "webdataset_ratio": wds_ips / tv_ips,  # trainforge reading WebDataset shards / torchvision's folder
        "startup_s": start,
        "cached_startup_factor": startup_factor,  # trainforge's cached scan / torchvision's listing
        "goal_startup_factor": GOAL_STARTUP_FACTOR,
        "meets_startup_goal": startup_factor <= GOAL_STARTUP_FACTOR,
        "relative_iqr": spread,
        "noisy": max(spread.values()) > NOISY_SPREAD,
        "rounds": rounds,
        "setup": {"images": args.images, "size": args.size, "classes": args.classes, "image_size": args.image_size,
                  "batch_size": args.batch_size, "workers": args.workers, "batches_per_round": batches,
                  "shard_samples": args.shard_samples,
                  "seed": args.seed, "format": "JPEG quality 90"},
        "machine": {"cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                    "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "date": datetime.date.today().isoformat(),
    }


def render(result: dict[str, Any]) -> str:
    s, st = result["setup"], result["startup_s"]
    lines = [f"data throughput: {s['images']:,} JPEGs {s['size']}x{s['size']} -> {s['image_size']}x{s['image_size']}, "
             f"batch {s['batch_size']}, {s['workers']} worker(s), {s['batches_per_round']} batches a round, "
             f"torch {result['machine']['torch']}", "",
             f"{'round':>5}  {'first':<11}  {'trainforge img/s':>16}  {'torchvision img/s':>17}  "
             f"{'webdataset img/s':>16}"]
    for r in result["rounds"]:
        lines.append(f"{r['round']:>5}  {r['first']:<11}  {r['trainforge_images_per_s']:>16.1f}  "
                     f"{r['torchvision_images_per_s']:>17.1f}  {r['webdataset_images_per_s']:>16.1f}")
    lines += [
        "",
        f"start-up: torchvision listing {st['torchvision_listing_s']:.3f} s; trainforge scan first "
        f"{st['trainforge_scan_first_s']:.3f} s, cached {st['trainforge_scan_cached_s']:.3f} s "
        f"({result['cached_startup_factor']:.2f}x the listing, goal <= {GOAL_STARTUP_FACTOR}); build_data first "
        f"{st['trainforge_build_data_first_s']:.3f} s, cached {st['trainforge_build_data_cached_s']:.3f} s",
        f"webdataset: prepared in {st['webdataset_prepare_s']:.2f} s, build_data {st['webdataset_build_data_s']:.3f} s, "
        f"{result['webdataset_ratio']:.3f}x torchvision's images/s",
        f"ratio {result['ratio']:.3f} ({'meets' if result['meets_goal'] else 'MISSES'} the goal >= {GOAL_RATIO})",
    ]
    if result["noisy"]:
        lines.append(f"note: spread above {NOISY_SPREAD:.0%}: other processes were competing for the CPU; rerun "
                     "when the machine is quiet before trusting the ratio")
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--size", type=int, default=256, help="generated JPEG width and height")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--image-size", type=int, default=64, help="data.args.image_size: what both sides resize to")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=20, help="per side and round (at most one epoch)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--shard-samples", type=int, default=256, help="webdataset: samples per shard")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    home = os.environ.get("TRAINFORGE_HOME")
    try:
        result = measure(args)
    finally:  # the benchmark's manifests lived in temporary homes
        if home is None:
            os.environ.pop("TRAINFORGE_HOME", None)
        else:
            os.environ["TRAINFORGE_HOME"] = home
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
