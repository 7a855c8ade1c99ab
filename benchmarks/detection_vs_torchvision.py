"""Detection training: trainforge's `train()` against torchvision's detection reference loop, same model, data, batch
and optimizer (issue 28, acceptance 5).

    .venv/bin/python benchmarks/detection_vs_torchvision.py            # table + ratio, about 3 minutes on 2 vCPUs
    .venv/bin/python benchmarks/detection_vs_torchvision.py --json     # one JSON document with a top-level "ratio"

The data: generated shapes (tests/vision_data.py: red rectangles and blue ellipses on noise, 64 x 64 PNGs, 1-3 per
image) written as a COCO folder. The model: torchvision's Faster R-CNN on a ResNet-18 FPN with anchors for
64-pixel images (`model.name: detector`, `backbone: resnet18`), its initial weights saved once and given to both
sides (trainforge through `model.args.pretrained`, the reference by `load_state_dict`).

trainforge runs as users run it: `trainforge.train(cfg, run_dir=...)` with `data.source: coco` (the files decoded
and resized per sample by its loader, 0 workers), SGD with momentum 0.9, a constant learning rate, no clipping, no
augmentation, fp32 on the CPU, a train row logged every 10 steps (the default). The reference is the loop of torchvision's references/detection (engine.py's
train_one_epoch without its first-epoch warmup: `loss_dict = model(images, targets); losses = sum(loss_dict
.values()); optimizer.zero_grad(); losses.backward(); optimizer.step()`) over a torch DataLoader (0 workers,
torchvision's `collate_fn` = tuple(zip(*batch))) of a Dataset that decodes the same PNG files with PIL and converts
them with `torchvision.transforms.v2.functional.to_image` and a division by 255 (as trainforge's reader divides:
ToDtype's multiplication by 1/255 differs in the last bit, and a proposal's fate with it), their boxes from the same COCO
file (x, y, w, h -> x1 y1 x2 y2), in the order trainforge's loader dealt them (read from the images of its
batches). Same thread count on both sides.

Same losses: Faster R-CNN samples anchors and proposals from torch's global generator; at its first training
forward each side's generator is set to the same state, and neither draws from it elsewhere. The loss of each step
is the sum of the model's loss dict, read by a forward hook on the detector on both sides.

Timing: a forward pre-hook on the detector (torchvision's GeneralizedRCNN, the module both sides train) reads two
clocks at the start of every training forward; a step is the time from one forward's start to the next one's
(data, forward, backward, optimizer, the loop's own work). `cpu` (process time, the headline: other jobs do not
inflate it, and with 1 thread it is the wall time of a quiet machine) and `wall` are both reported. The first
`--skip` steps of each run are warm-up. Interleaving (`--interleave step`, the default; benchmarks/lockstep.py):
each repeat runs the two trainings in lockstep, trainforge in the main thread and the reference loop in a second
one, one step each in turn (the waiting side is blocked, outside its clocks, and keeps its own RNG stream), so step k
of one is timed right next to step k of the other; the repeats alternate which side steps first. The reference's
batch order and generator state come from an untimed trainforge run before the repeats (each repeat checks that
trainforge dealt the same). `--interleave run` runs whole trainings one after the other instead.

Printed: ratio = median trainforge step / median reference step (goal <= 1.0), both medians, the median of the
step-by-step ratios (step k of each side had the same batch, so the ratio of the two has the machine's noise only,
not the batches' different costs) and its spread (a note when it is above 10%: other processes were competing), and
the largest absolute difference between the two per-step loss curves. Always exits 0: the ratio is a measurement,
not a test.
"""
from __future__ import annotations

import argparse
import hashlib
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
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # vision_data: the tests' generated shapes
sys.path.insert(0, str(Path(__file__).resolve().parent))  # lockstep: shared with the other side-by-side benchmarks

import trainforge  # noqa: E402
from lockstep import Baton, lockstep, relative_iqr  # noqa: E402
from trainforge.metrics_file import read_metrics  # noqa: E402
from vision_data import write_shapes  # noqa: E402

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
SIDES = ("trainforge", "torchvision")
LOG_EVERY_STEPS = 10  # train.log_every_steps' default: the gradient norm is measured on logged steps only
NOISY_SPREAD = 0.10  # relative interquartile range of step times above which a note says the machine was busy
# proposals and sampled boxes sized for a few objects an image, as in tests/e2e/test_detection.py
MODEL_ARGS = {"arch": "fasterrcnn_resnet50_fpn", "backbone": "resnet18", "anchor_sizes": [8, 16, 32, 64, 128],
              "options": {"rpn_pre_nms_top_n_train": 300, "rpn_post_nms_top_n_train": 100,
                          "rpn_pre_nms_top_n_test": 300, "rpn_post_nms_top_n_test": 50, "box_batch_size_per_image": 32}}


class DetectorProbe:
    """Hooks on torchvision's GeneralizedRCNN, attached at its first training forward in this thread (found by a
    global pre-hook): both clocks at the start of every training forward (the end of the previous step, then, after
    the other side's step when there is a baton, the start of this one), the images of each batch, each step's summed
    loss dict. At the first forward the global RNG state is recorded and, given `rng_state`, replaced; with a baton
    each side keeps its own RNG stream across turns (the two threads share torch's global generator)."""

    def __init__(self, side: str, rng_state: Optional[torch.Tensor] = None, baton: Optional[Baton] = None) -> None:
        self.side, self.rng_state, self.baton = side, rng_state, baton
        self.starts: dict[str, list[float]] = {c: [] for c in CLOCKS}
        self.ends: dict[str, list[float]] = {c: [] for c in CLOCKS}
        self.losses: list[float] = []
        self.batches: list[torch.Tensor] = []
        self.first_rng: Optional[torch.Tensor] = None
        self._handles: list[Any] = []

    def __enter__(self) -> "DetectorProbe":
        from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN

        self._cls, self._thread = GeneralizedRCNN, threading.get_ident()
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
        if not (isinstance(module, self._cls) and module.training and threading.get_ident() == self._thread):
            return
        self._finder.remove()
        self.first_rng = torch.get_rng_state()
        own = self.rng_state if self.rng_state is not None else self.first_rng
        if self.baton is not None:
            self.baton.arrive(self.side)
        torch.set_rng_state(own)
        self._handles += [module.register_forward_pre_hook(lambda m, a: self._start(m, a)),
                          module.register_forward_hook(lambda m, a, o: self._end(m, a, o))]
        self._keep(args)
        self._stamp(self.starts)  # this call's hooks were collected before ours were added

    def _keep(self, args: tuple) -> None:
        images = args[0]
        self.batches.append(torch.stack(list(images)) if isinstance(images, (list, tuple)) else images)

    def _start(self, module: torch.nn.Module, args: tuple) -> None:
        if not module.training:
            return
        self._stamp(self.ends)
        if self.baton is not None:
            own = torch.get_rng_state()
            self.baton.hand_over(self.side)
            torch.set_rng_state(own)
        self._keep(args)
        self._stamp(self.starts)

    def _end(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if module.training:
            self.losses.append(float(sum(v.detach().float() for v in output.values())))

    def step_times(self, clock: str, skip: int) -> list[float]:
        """Seconds of each step but the last (it has no next forward to end it), the first `skip` dropped."""
        return [e - s for s, e in zip(self.starts[clock], self.ends[clock])][skip:]


class Shapes(torch.utils.data.Dataset):
    """The reference's dataset: the PNG files in a given order, decoded with PIL, boxes from the COCO file."""

    def __init__(self, root: Path, files: list[str]) -> None:
        doc = json.loads((root / "annotations.json").read_text())
        ids = {im["file_name"]: im["id"] for im in doc["images"]}
        boxes: dict[int, list] = {i: [] for i in ids.values()}
        for a in doc["annotations"]:
            x, y, w, h = a["bbox"]
            boxes[a["image_id"]].append(([x, y, x + w, y + h], a["category_id"]))
        self.root, self.files = root, files
        self.targets = [boxes[ids[f]] for f in files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        import torchvision.transforms.v2.functional as TF

        with Image.open(self.root / "images" / self.files[i]) as img:
            # torchvision's PILToTensor, then to float in [0, 1] by dividing by 255 (ToDtype(scale=True) multiplies by
            # 1/255, which differs from trainforge's division in the last bit: enough to change a proposal's fate)
            image = TF.to_image(img.convert("RGB")).to(torch.float32) / 255
        target = self.targets[i]
        return image, {"boxes": torch.tensor([b for b, _ in target], dtype=torch.float32).reshape(-1, 4),
                       "labels": torch.tensor([c for _, c in target], dtype=torch.int64)}


def collate_fn(batch: list) -> tuple:  # torchvision's references/detection/utils.py collate
    return tuple(zip(*batch))


def dealt_files(root: Path, probe: DetectorProbe) -> list[str]:
    """The files trainforge's batches held, in order: each image's pixels matched to a file's."""
    by_pixels = {}
    for path in sorted((root / "images").glob("*.png")):
        with Image.open(path) as img:
            pixels = np.asarray(img.convert("RGB"), dtype=np.float32).transpose(2, 0, 1) / 255.0
        by_pixels[hashlib.sha256(np.round(pixels, 4).tobytes()).hexdigest()] = path.name
    files = []
    for batch in probe.batches:
        for image in batch:
            files.append(by_pixels[hashlib.sha256(np.round(image.numpy(), 4).tobytes()).hexdigest()])
    return files


def run_trainforge(root: Path, weights: Path, args: argparse.Namespace, probe: DetectorProbe) -> dict[str, Any]:
    overrides = [f"data.path={root}", "data.args.image_size=64", "data.normalize=none", "data.augment={}",
                 "data.num_workers=0", "data.val_fraction=0.05", "data.test_fraction=0.05",
                 "model.args=" + json.dumps({**MODEL_ARGS, "pretrained": str(weights)}),
                 f"optim={{name: sgd, lr: {args.lr}, momentum: 0.9, weight_decay: 0}}", "schedule={name: constant}",
                 f"train.max_steps={args.steps}", f"train.global_batch_size={args.batch_size}",
                 f"train.micro_batch_size={args.batch_size}", "train.grad_clip_norm=null", "train.precision=fp32",
                 "train.device=cpu", f"train.num_threads={args.threads}", "train.early_stopping=null",
                 f"train.eval_every_steps={args.steps}", f"train.checkpoint_every_steps={args.steps}",
                 f"train.log_every_steps={LOG_EVERY_STEPS}", "log.progress=false", "log.tensorboard=false", "log.report=false",
                 f"seed={args.seed}"]
    cfg = trainforge.load_config("coco_detection_finetune", overrides)
    with tempfile.TemporaryDirectory(prefix="detection-tf-") as tmp, probe:
        t0 = time.perf_counter()
        result = trainforge.train(cfg, run_dir=Path(tmp) / "run")
        wall_s = time.perf_counter() - t0
        rows = [r for r in read_metrics(result.run_dir / "metrics.jsonl") if r["split"] == "train"]
    assert len(probe.losses) == args.steps and rows
    for row in rows:  # each logged loss is the mean of its window's steps: the losses the probe read are trainforge's
        window = probe.losses[(row["step"] - 1) // LOG_EVERY_STEPS * LOG_EVERY_STEPS: row["step"]]
        assert abs(statistics.fmean(window) - row["loss"]) < 1e-5 * max(1.0, abs(row["loss"])), (row, window)
    return {"wall_s": wall_s}


def run_reference(root: Path, weights: Path, files: list[str], args: argparse.Namespace,
                  probe: DetectorProbe) -> dict[str, Any]:
    from trainforge.data.base import DataInfo
    from trainforge.models.detectors import build_detector

    torch.set_num_threads(args.threads)
    info = DataInfo("detection", "image", (3, 64, 64), "float32", 3, ("__background__", "box", "disc"))
    model, _ = build_detector(info, **MODEL_ARGS, pretrained=False)  # the same architecture as torchvision builds it
    model.load_state_dict(torch.load(weights, weights_only=True))
    loader = torch.utils.data.DataLoader(Shapes(root, files), batch_size=args.batch_size, shuffle=False,
                                         num_workers=0, collate_fn=collate_fn)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=0)
    model.train()
    t0 = time.perf_counter()
    with probe:
        for images, targets in loader:  # references/detection/engine.py: train_one_epoch, without its warmup
            loss_dict = model(list(images), list(targets))
            losses = sum(loss for loss in loss_dict.values())
            optimizer.zero_grad()
            losses.backward()
            optimizer.step()
    return {"wall_s": time.perf_counter() - t0}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="detection-bench-") as tmp:
        root = Path(tmp)
        write_shapes(root, n=args.images, side=64, seed=args.seed, formats=("coco",))
        data = root / "coco"
        from trainforge.data.base import DataInfo
        from trainforge.models.detectors import build_detector

        info = DataInfo("detection", "image", (3, 64, 64), "float32", 3, ("__background__", "box", "disc"))
        model, _ = build_detector(info, **MODEL_ARGS, pretrained=False)
        weights = root / "init.pth"
        torch.save(model.state_dict(), weights)
        # the reference needs the order trainforge deals its batches in and its generator's state at the first step:
        # an untimed trainforge run learns both (every run of the same seed deals the same; each repeat checks it)
        warm = DetectorProbe("trainforge")
        run_trainforge(data, weights, args, warm)
        order, rng = dealt_files(data, warm), warm.first_rng
        pooled = {c: {"trainforge": [], "torchvision": []} for c in CLOCKS}
        paired: dict[str, list[float]] = {c: [] for c in CLOCKS}  # step k of one side / step k of the other
        rows, max_diff = [], 0.0
        curves: dict[str, list[float]] = {}
        for repeat in range(args.repeats):
            first = SIDES[repeat % 2]
            baton = Baton(first, SIDES) if args.interleave == "step" else None
            tf_probe = DetectorProbe("trainforge", baton=baton)
            ref_probe = DetectorProbe("torchvision", rng_state=rng, baton=baton)
            if baton is not None:  # lockstep: one step each in turn, `first` first
                tf, ref = lockstep(baton, lambda: run_trainforge(data, weights, args, tf_probe),
                                   lambda: run_reference(data, weights, order, args, ref_probe))
            elif first == "trainforge":
                tf = run_trainforge(data, weights, args, tf_probe)
                ref = run_reference(data, weights, order, args, ref_probe)
            else:
                ref = run_reference(data, weights, order, args, ref_probe)
                tf = run_trainforge(data, weights, args, tf_probe)
            assert dealt_files(data, tf_probe) == order and torch.equal(tf_probe.first_rng, rng)
            diff = max(abs(a - b) for a, b in zip(tf_probe.losses, ref_probe.losses))
            max_diff = max(max_diff, diff)
            curves = {"trainforge": tf_probe.losses, "torchvision": ref_probe.losses}
            row = {"repeat": repeat + 1, "first": first, "max_loss_diff": diff,
                   "trainforge_wall_s": tf["wall_s"], "torchvision_wall_s": ref["wall_s"]}
            for c in CLOCKS:
                a, b = tf_probe.step_times(c, args.skip), ref_probe.step_times(c, args.skip)
                pooled[c]["trainforge"] += a
                pooled[c]["torchvision"] += b
                paired[c] += [x / y for x, y in zip(a, b)]
                row[f"{c}_ratio"] = statistics.median(a) / statistics.median(b)
            rows.append(row)
            print(f"repeat {repeat + 1}/{args.repeats} ({first} first): cpu ratio {row['cpu_ratio']:.3f}, wall ratio "
                  f"{row['wall_ratio']:.3f}, max loss diff {diff:.1e}", file=sys.stderr, flush=True)
    by_clock = {}
    for c, sides in pooled.items():
        medians = {s: statistics.median(t) for s, t in sides.items()}
        spread = {s: relative_iqr(t) for s, t in sides.items()}
        # a step's cost follows its batch (how many boxes, which proposals survive): the two sides' step k had the
        # same batch, so their ratio has the machine's noise only, and its spread is what says whether it was quiet
        pairs = paired[c]
        by_clock[c] = {"ratio": medians["trainforge"] / medians["torchvision"], "step_s": medians,
                       "relative_iqr": spread, "paired_median_ratio": statistics.median(pairs),
                       "paired_relative_iqr": relative_iqr(pairs), "noisy": relative_iqr(pairs) > NOISY_SPREAD}
    return {"benchmark": "detection_vs_torchvision", "ratio": by_clock[args.clock]["ratio"], "clock": args.clock,
            "by_clock": by_clock, "max_loss_diff": max_diff, "repeats": rows,
            "loss_first": {k: v[0] for k, v in curves.items()},
            "loss_last_mean": {k: statistics.fmean(v[-10:]) for k, v in curves.items()},
            "settings": {k: getattr(args, k) for k in ("steps", "skip", "batch_size", "images", "threads", "lr",
                                                        "repeats", "seed", "interleave")},
            "machine": {"python": platform.python_version(), "torch": torch.__version__,
                        "platform": platform.platform(), "date": time.strftime("%Y-%m-%d")}}


def render(result: dict[str, Any]) -> str:
    lines = [f"detection training step, trainforge / torchvision reference loop ({result['clock']} clock): "
             f"ratio {result['ratio']:.3f} (goal <= 1.0)"]
    for c, r in result["by_clock"].items():
        lines.append(f"  {c}: trainforge {r['step_s']['trainforge'] * 1e3:.1f} ms, reference "
                     f"{r['step_s']['torchvision'] * 1e3:.1f} ms, ratio {r['ratio']:.3f}; step by step "
                     f"(same batch) median ratio {r['paired_median_ratio']:.3f}, spread {r['paired_relative_iqr']:.1%}"
                     + (" (noisy: rerun on a quiet machine)" if r["noisy"] else ""))
    lines.append(f"  loss curves: largest per-step difference {result['max_loss_diff']:.2e}; first step "
                 f"{result['loss_first']['trainforge']:.4f} vs {result['loss_first']['torchvision']:.4f}, last 10 "
                 f"{result['loss_last_mean']['trainforge']:.4f} vs {result['loss_last_mean']['torchvision']:.4f}")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=4, help="runs of each side, alternating which goes first")
    p.add_argument("--steps", type=int, default=40, help="training steps per run")
    p.add_argument("--skip", type=int, default=5, help="warm-up steps not timed")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--images", type=int, default=400, help="generated images (the train split is about 90%%)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--clock", choices=list(CLOCKS), default="cpu")
    p.add_argument("--interleave", choices=("step", "run"), default="step",
                   help="step: the two trainings in lockstep, one step each in turn; run: whole runs one after the other")
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
