"""LiDAR 3D detection training: trainforge's `train()` against a plain PyTorch loop on the same PointPillars, data
and voxelization (issue 52, acceptance 8); and the data pipeline's frames per second against what a step consumes.

    .venv/bin/python benchmarks/pointpillars_vs_plain.py            # table + ratio, about 3 minutes on 2 vCPUs
    .venv/bin/python benchmarks/pointpillars_vs_plain.py --json     # one JSON document with a top-level "ratio"

The data: generated drives in KITTI's layout (tests/lidar_data.py: a noisy ground and cuboids of three classes at
5-40 m, ray-cast by a 32-beam sensor), 0.32 m pillars over x 0-40.96 m, y +-25.6 m (a 128 x 160 grid), at most 16
points a pillar and 6,000 pillars a frame. The model: PointPillars with CenterPoint's head (`model.name:
pointpillars`), narrower and shallower than OpenPCDet's (32-64-64 channels, 1-2-2 extra convolutions a block).

trainforge runs as users run it: `trainforge.train(cfg, run_dir=...)` with `data.source: kitti`, no augmentation, 0
workers, AdamW at a constant learning rate, no clipping, fp32 on the CPU, a train row every 10 steps (the default).
The plain loop: a torch DataLoader (0 workers, shuffled) over a Dataset that reads the same train frames' .bin files
with numpy and their boxes from the same source's samples, collated by the same functions (`trainforge.points3d.
voxelize` and `tasks/centers3d.py: center_targets`, through `tasks/detection3d.py: collate_frames`), then
`loss = sum(center_loss(model(inputs), ...).values()); optimizer.zero_grad(); loss.backward(); optimizer.step()`.
It starts from trainforge's initial weights (copied at trainforge's first training forward). Same thread count.
A step's cost is the padded network's (every frame is padded to the pillar cap), so the two sides' batches need not
be the same frames.

Timing: a forward pre-hook on the PointPillars module reads two clocks at the start of every training forward; a
step is the time from one forward's start to the next (data, forward, backward, optimizer, the loop's own work).
`cpu` (process time; the headline) and `wall` are both reported; the first `--skip` steps are warm-up. The two
trainings run in lockstep (benchmarks/lockstep.py): trainforge in the main thread, the plain loop in a second one,
one step each in turn, the repeats alternating which side steps first.

Printed: ratio = median trainforge step / median plain step (goal <= 1.05), both medians and their spread; then the
data pipeline: frames per second that trainforge's train split gives through 2 DataLoader workers with ground-truth
sampling and the global augmentations on (read + paste + augment + voxelize + targets), against the frames per
second a training step consumes (micro-batch / median step). Always exits 0: the ratio is a measurement, not a test.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # lidar_data: the tests' generated drives
sys.path.insert(0, str(Path(__file__).resolve().parent))  # lockstep: shared with the other side-by-side benchmarks

import trainforge  # noqa: E402
from lidar_data import make_scenes, write_kitti  # noqa: E402
from lockstep import Baton, lockstep, relative_iqr  # noqa: E402

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
SIDES = ("trainforge", "plain")
DATA_ARGS = {"point_cloud_range": [0, -25.6, -3, 40.96, 25.6, 1], "voxel_size": [0.32, 0.32, 4],
             "max_points_per_voxel": 16, "max_voxels": [6000, 8000]}
MODEL_ARGS = {"pillar_channels": 32, "channels": [32, 64, 64], "layers": [1, 2, 2], "up_channels": 32,
              "head_channels": 32}
AUGMENT = {"gt_sampling": {"Car": 10, "Pedestrian": 10, "Cyclist": 10}, "world_rotation_deg": 45,
           "world_scaling": [0.95, 1.05], "world_flip": 0.5}
NOISY_SPREAD = 0.10


class StepProbe:
    """Hooks on the PointPillars module trained in this thread, attached at its first training forward: both clocks
    at the start of every training forward. With a baton each side takes its turn there. `on_first(module)` runs at
    the first forward (the plain side copies the weights trainforge starts from)."""

    def __init__(self, side: str, baton: Optional[Baton] = None) -> None:
        from trainforge.models.pointpillars import PointPillars

        self.side, self.baton, self.cls = side, baton, PointPillars
        self.starts: dict[str, list[float]] = {c: [] for c in CLOCKS}
        self.first_weights: Optional[dict[str, torch.Tensor]] = None
        self._handles: list[Any] = []

    def __enter__(self) -> "StepProbe":
        self._thread = threading.get_ident()
        self._finder = torch.nn.modules.module.register_module_forward_pre_hook(self._find)
        return self

    def __exit__(self, *exc: object) -> None:
        self._finder.remove()
        for h in self._handles:
            h.remove()

    def _stamp(self) -> None:
        for clock, read in CLOCKS.items():
            self.starts[clock].append(read())

    def _find(self, module: torch.nn.Module, args: tuple) -> None:
        if not (isinstance(module, self.cls) and module.training and threading.get_ident() == self._thread):
            return
        self._finder.remove()
        self.first_weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
        if self.baton is not None:
            self.baton.arrive(self.side)
        self._handles.append(module.register_forward_pre_hook(lambda m, a: self._next(m)))
        self._stamp()

    def _next(self, module: torch.nn.Module) -> None:
        if not module.training:
            return
        if self.baton is not None:
            self.baton.hand_over(self.side)
        self._stamp()

    def step_times(self, clock: str, skip: int) -> list[float]:
        s = self.starts[clock]
        return [b - a for a, b in zip(s, s[1:])][skip:]


def overrides(root: Path, args: argparse.Namespace, augment: Optional[dict] = None) -> list[str]:
    return ["data.source=kitti", f"data.path={root}", "data.args=" + json.dumps(DATA_ARGS),
            "data.augment=" + json.dumps(augment or {}), "data.num_workers=0", "model.name=pointpillars",
            "model.args=" + json.dumps(MODEL_ARGS), f"optim={{name: adamw, lr: {args.lr}, weight_decay: 0.01}}",
            "schedule={name: constant}", f"train.max_steps={args.steps}",
            f"train.global_batch_size={args.batch_size}", f"train.micro_batch_size={args.batch_size}",
            "train.grad_clip_norm=null", "train.precision=fp32", "train.device=cpu",
            f"train.num_threads={args.threads}", "train.early_stopping=null", f"train.eval_every_steps={args.steps}",
            f"train.checkpoint_every_steps={args.steps}", "log.progress=false", "log.tensorboard=false",
            "log.report=false", f"seed={args.seed}"]


def run_trainforge(root: Path, args: argparse.Namespace, probe: StepProbe) -> None:
    cfg = trainforge.load_config(None, overrides(root, args))
    with tempfile.TemporaryDirectory(prefix="pillars-tf-") as tmp, probe:
        trainforge.train(cfg, run_dir=Path(tmp) / "run")


class Frames(torch.utils.data.Dataset):
    """The plain loop's dataset: the train frames' .bin files read with numpy, kept in range, their boxes."""

    def __init__(self, files: list[str], boxes: list[np.ndarray], labels: list[np.ndarray]) -> None:
        self.files, self.boxes, self.labels = files, boxes, labels
        self.range = DATA_ARGS["point_cloud_range"]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        points = np.fromfile(self.files[i], dtype=np.float32).reshape(-1, 4)
        r = self.range
        keep = ((points[:, 0] >= r[0]) & (points[:, 0] < r[3]) & (points[:, 1] >= r[1]) & (points[:, 1] < r[4])
                & (points[:, 2] >= r[2]) & (points[:, 2] < r[5]))
        return points[keep], {"boxes": self.boxes[i], "labels": self.labels[i]}


def run_plain(root: Path, args: argparse.Namespace, probe: StepProbe, start: dict[str, torch.Tensor]) -> None:
    import functools

    from trainforge.config import ModelConfig
    from trainforge.data import build_data
    from trainforge.models.zoo import build_model
    from trainforge.tasks.centers3d import OUTPUT_STRIDE, center_loss
    from trainforge.tasks.detection3d import collate_frames

    torch.set_num_threads(args.threads)
    data = build_data(trainforge.load_config(None, overrides(root, args)).data, seed=args.seed)
    samples, train = data.train.samples, data.train.indices  # the pool's frames and the train split's
    frames = Frames([samples.files[i] for i in train], [samples.boxes[i] for i in train],
                    [samples.labels[i] for i in train])
    model, _ = build_model(ModelConfig(name="pointpillars", args=MODEL_ARGS), data.info)
    model.load_state_dict(start)
    collate = functools.partial(collate_frames, point_cloud_range=DATA_ARGS["point_cloud_range"],
                                voxel_size=DATA_ARGS["voxel_size"], max_points=DATA_ARGS["max_points_per_voxel"],
                                max_voxels=DATA_ARGS["max_voxels"][0], fixed=True, num_classes=data.info.num_classes,
                                stride=OUTPUT_STRIDE)
    loader = torch.utils.data.DataLoader(frames, batch_size=args.batch_size, shuffle=True, num_workers=0,
                                         collate_fn=collate, drop_last=True,
                                         generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    model.train()
    steps = 0
    with probe:
        while steps < args.steps:
            for inputs, targets, _ in loader:
                maps = model(inputs)
                loss = sum(center_loss(maps, targets["heatmap"], targets["index"], targets["mask"],
                                       targets["regression"]).values())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                steps += 1
                if steps == args.steps:
                    break


def pipeline_fps(root: Path, args: argparse.Namespace) -> dict[str, float]:
    """Frames a second from trainforge's train split with GT sampling and the global augmentations, collated
    (voxelized, targets drawn) by 2 DataLoader workers, after a warm-up batch."""
    from trainforge.data import build_data
    from trainforge.tasks import task_of

    data = build_data(trainforge.load_config(None, overrides(root, args, AUGMENT)).data, seed=args.seed)
    collate = task_of(data.info).collator(data.info, train=True)

    class Epoch(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(data.train)

        def __getitem__(self, i: int) -> Any:
            return data.train[(0, i)]

    loader = torch.utils.data.DataLoader(Epoch(), batch_size=args.batch_size, num_workers=2, collate_fn=collate,
                                         persistent_workers=False)
    it = iter(loader)
    next(it)  # the workers' start and their object databases
    t0, frames = time.perf_counter(), 0
    for inputs, _, _ in it:
        frames += len(inputs["voxels"])
    return {"frames_per_s": frames / (time.perf_counter() - t0), "frames": frames, "workers": 2}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="pillars-bench-") as tmp:
        root = write_kitti(Path(tmp) / "kitti", make_scenes(args.frames, seed=args.seed))
        pooled = {c: {s: [] for s in SIDES} for c in CLOCKS}
        paired: dict[str, list[float]] = {c: [] for c in CLOCKS}
        rows = []
        for repeat in range(args.repeats):
            first = SIDES[repeat % 2]
            baton = Baton(first, SIDES)
            tf_probe, plain_probe = StepProbe("trainforge", baton), StepProbe("plain", baton)
            lockstep(baton, lambda: run_trainforge(root, args, tf_probe),
                     lambda: run_plain(root, args, plain_probe, tf_probe.first_weights))
            row = {"repeat": repeat + 1, "first": first}
            for c in CLOCKS:
                a, b = tf_probe.step_times(c, args.skip), plain_probe.step_times(c, args.skip)
                pooled[c]["trainforge"] += a
                pooled[c]["plain"] += b
                paired[c] += [x / y for x, y in zip(a, b)]
                row[f"{c}_ratio"] = statistics.median(a) / statistics.median(b)
            rows.append(row)
            print(f"repeat {repeat + 1}/{args.repeats} ({first} first): cpu ratio {row['cpu_ratio']:.3f}, wall ratio "
                  f"{row['wall_ratio']:.3f}", file=sys.stderr, flush=True)
        fps = pipeline_fps(root, args)
    by_clock = {}
    for c, sides in pooled.items():
        medians = {s: statistics.median(t) for s, t in sides.items()}
        by_clock[c] = {"ratio": medians["trainforge"] / medians["plain"], "step_s": medians,
                       "relative_iqr": {s: relative_iqr(t) for s, t in sides.items()},
                       "paired_median_ratio": statistics.median(paired[c]),
                       "paired_relative_iqr": relative_iqr(paired[c]),
                       "noisy": relative_iqr(paired[c]) > NOISY_SPREAD}
    consumed = args.batch_size / by_clock["wall"]["step_s"]["trainforge"]
    return {"benchmark": "pointpillars_vs_plain", "ratio": by_clock[args.clock]["ratio"], "clock": args.clock,
            "by_clock": by_clock, "repeats": rows,
            "pipeline": {**fps, "step_consumes_frames_per_s": consumed, "headroom": fps["frames_per_s"] / consumed},
            "settings": {k: getattr(args, k) for k in ("steps", "skip", "batch_size", "frames", "threads", "lr",
                                                        "repeats", "seed")},
            "machine": {"python": platform.python_version(), "torch": torch.__version__,
                        "platform": platform.platform(), "date": time.strftime("%Y-%m-%d")}}


def render(result: dict[str, Any]) -> str:
    lines = [f"PointPillars training step, trainforge / plain PyTorch loop ({result['clock']} clock): "
             f"ratio {result['ratio']:.3f} (goal <= 1.05)"]
    for c, r in result["by_clock"].items():
        lines.append(f"  {c}: trainforge {r['step_s']['trainforge'] * 1e3:.1f} ms, plain "
                     f"{r['step_s']['plain'] * 1e3:.1f} ms, ratio {r['ratio']:.3f}; step by step median ratio "
                     f"{r['paired_median_ratio']:.3f}, spread {r['paired_relative_iqr']:.1%}"
                     + (" (noisy: rerun on a quiet machine)" if r["noisy"] else ""))
    p = result["pipeline"]
    lines.append(f"  data pipeline (GT sampling + global augmentation + voxelize, {p['workers']} workers): "
                 f"{p['frames_per_s']:.1f} frames/s; a training step consumes {p['step_consumes_frames_per_s']:.1f} "
                 f"frames/s (headroom x{p['headroom']:.1f})")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=4, help="runs of each side, alternating which goes first")
    p.add_argument("--steps", type=int, default=30, help="training steps per run")
    p.add_argument("--skip", type=int, default=5, help="warm-up steps not timed")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--frames", type=int, default=80, help="generated frames (the train split is about 80%%)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    result = measure(args)
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
