"""DDP overlap: trainforge's `ddp` gradient all-reduce (buckets launched from inside backward) against the
same all-reduce after backward, with torch's DistributedDataParallel as the anchor, on 2 processes.

    .venv/bin/python benchmarks/ddp_overlap.py                  # table + ratio, about 1 minute on 2 vCPUs
    .venv/bin/python benchmarks/ddp_overlap.py --json           # one JSON document with a top-level "ratio"

Model: an MLP of `--depth` square Linear layers of `--width` (default 8 x 1536: 19M parameters, 76 MB of fp32
gradients per step) at a small batch, so that the gradient all-reduce is a sizeable share of the step. Each
process builds the same model from the same seed. Three ways of syncing the gradients, interleaved in every
repeat (the order rotates), each timed over `--steps` steps after `--warmup`:

- `overlapped`: `trainforge.engine.data_parallel.OverlappedAllReduce`, what `distributed.strategy: ddp`
  runs: ~25 MiB buckets, each all-reduced asynchronously as soon as backward has produced its gradients;
- `post_backward`: backward first, then the same buckets all-reduced one after another (no overlap; what
  trainforge did before);
- `torch_ddp`: `torch.nn.parallel.DistributedDataParallel` (default 25 MiB buckets), the anchor.

ratio = median step time of post_backward / median step time of overlapped (above 1: overlap saves time).
Also printed: torch_ddp / overlapped, and in how many steps the first bucket was launched before backward had
finished (the overlap itself, independent of whether the machine has room to profit from it).

On CPUs the processes talk over gloo, whose all-reduce runs on CPU threads that compete with backward for the
same cores: with 2 vCPUs and 2 processes there is hardly a core left for communication to overlap with, so the
ratio stays near 1 whatever the overlap. With `--device cuda` (2+ GPUs, NCCL) compute and communication run on
different engines and the ratio shows the saving. Always exits 0: a ratio is a measurement, not a test.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from trainforge.engine.data_parallel import BUCKET_BYTES, OverlappedAllReduce
from trainforge.engine.env import DistEnv

MODES = ("overlapped", "post_backward", "torch_ddp")
NOISY_SPREAD = 0.10


def build(width: int, depth: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10)).to(device)


def post_backward_all_reduce(model: nn.Module, world_size: int) -> None:
    """The anchor without overlap: the same ~25 MiB buckets, reduced after backward has finished."""
    bucket: list[torch.Tensor] = []
    size = 0
    grads = [p.grad for p in reversed(list(model.parameters()))]
    for g in grads + [None]:
        if g is None or (bucket and size + g.numel() * g.element_size() > BUCKET_BYTES):
            flat = torch.cat([b.reshape(-1) for b in bucket])
            flat.div_(world_size)
            dist.all_reduce(flat)
            offset = 0
            for b in bucket:
                b.copy_(flat[offset: offset + b.numel()].view_as(b))
                offset += b.numel()
            bucket, size = [], 0
        if g is not None:
            bucket.append(g)
            size += g.numel() * g.element_size()


def run_mode(mode: str, model: nn.Module, ddp: nn.Module, buckets: OverlappedAllReduce, x: torch.Tensor,
             y: torch.Tensor, steps: int, warmup: int, world_size: int, device: torch.device) -> dict[str, Any]:
    times, early = [], 0
    for i in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        sync(device)
        start = time.perf_counter()
        if mode == "torch_ddp":
            nn.functional.cross_entropy(ddp(x), y).backward()
        elif mode == "overlapped":
            loss = nn.functional.cross_entropy(model(x), y)
            with buckets.syncing():
                loss.backward()
                sync(device)
                backward_end = time.perf_counter()
            early += i >= warmup and bool(buckets.launch_times_s) and buckets.launch_times_s[0] < backward_end
        else:
            nn.functional.cross_entropy(model(x), y).backward()
            post_backward_all_reduce(model, world_size)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return {"times_s": times, "first_launch_before_backward_end": early if mode == "overlapped" else 0}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(rank: int, port: int, out_dir: str, cfg: dict[str, Any]) -> None:
    torch.set_num_threads(cfg["threads"])
    use_cuda = cfg["device"] == "cuda"
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    # a client of the store whose server the parent process holds until both ranks have exited: no rank can lose
    # the server while it shuts down
    store = dist.TCPStore("127.0.0.1", port, 2, False)
    dist.init_process_group("nccl" if use_cuda else "gloo", store=store, rank=rank, world_size=2)
    env = DistEnv(rank=rank, local_rank=rank, world_size=2, backend=dist.get_backend())
    model = build(cfg["width"], cfg["depth"], device)
    buckets = OverlappedAllReduce(model, env)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank] if use_cuda else None)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(cfg["batch"], cfg["width"], generator=g).to(device)
    y = torch.randint(0, 10, (cfg["batch"],), generator=g).to(device)
    results: dict[str, list] = {m: [] for m in MODES}
    for r in range(cfg["repeats"]):
        order = MODES[r % 3:] + MODES[: r % 3]  # rotate who goes first: a drift of the machine hits all
        for mode in order:
            results[mode].append(run_mode(mode, model, ddp, buckets, x, y, cfg["steps"], cfg["warmup"], 2, device))
    if rank == 0:
        Path(out_dir, "rank0.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(*, steps: int = 20, warmup: int = 3, repeats: int = 3, width: int = 1536, depth: int = 8, batch: int = 16,
            threads: int = 1, device: str = "cpu") -> dict[str, Any]:
    """Run the 2 processes and summarize: one JSON-able document with a top-level `ratio`."""
    if device == "cuda" and torch.cuda.device_count() < 2:
        raise SystemExit("--device cuda needs 2 GPUs (one per process, NCCL); use --device cpu")
    cfg = dict(steps=steps, warmup=warmup, repeats=repeats, width=width, depth=depth, batch=batch, threads=threads,
               device=device)
    port = free_port()
    # the store's server lives here, not in rank 0: a rank's store client that outlives its server mid-shutdown
    # aborts ("terminate called without an active exception"), which failed CI twice
    server = dist.TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False)
    try:
        with tempfile.TemporaryDirectory(prefix="ddp-overlap-") as tmp:
            mp.start_processes(worker, args=(port, tmp, cfg), nprocs=2, start_method="spawn")
            raw = json.loads(Path(tmp, "rank0.json").read_text())
    finally:
        del server
    summary: dict[str, Any] = {}
    for mode in MODES:
        times = [t for run in raw[mode] for t in run["times_s"]]
        q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
        median = statistics.median(times)
        summary[mode] = {
            "median_step_s": median, "spread": (q[2] - q[0]) / median, "steps": len(times),
            "first_launch_before_backward_end": sum(run["first_launch_before_backward_end"] for run in raw[mode]),
        }
    params = sum(p.numel() for p in build(width, depth, torch.device("meta")).parameters())
    return {
        "ratio": summary["post_backward"]["median_step_s"] / summary["overlapped"]["median_step_s"],
        "torch_ddp_over_overlapped": summary["torch_ddp"]["median_step_s"] / summary["overlapped"]["median_step_s"],
        **summary,
        "world_size": 2, "backend": "nccl" if device == "cuda" else "gloo", "device": device,
        "params": params, "gradient_bytes": params * 4, "config": cfg,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, torch {torch.__version__}",
        "date": datetime.date.today().isoformat(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    doc = measure(steps=args.steps, warmup=args.warmup, repeats=args.repeats, width=args.width, depth=args.depth,
                  batch=args.batch_size, threads=args.threads, device=args.device)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{doc['params'] / 1e6:.1f}M parameters ({doc['gradient_bytes'] / 2**20:.0f} MiB of gradients), "
          f"2 processes over {doc['backend']}, batch {args.batch_size} per process", file=sys.stderr)
    for mode in MODES:
        m = doc[mode]
        flag = "  (noisy: rerun on a quiet machine)" if m["spread"] > NOISY_SPREAD else ""
        early = f", first bucket before backward end in {m['first_launch_before_backward_end']}/{m['steps']} steps" \
            if mode == "overlapped" else ""
        print(f"{mode:14s} median step {m['median_step_s'] * 1e3:8.1f} ms  spread {m['spread']:.1%}{early}{flag}")
    print(f"ratio (post_backward / overlapped): {doc['ratio']:.3f}")
    print(f"torch DDP / overlapped: {doc['torch_ddp_over_overlapped']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
