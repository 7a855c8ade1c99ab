"""Measuring an ONNX artifact on the CPU: latency (median and p90) at a fixed thread count, and test metrics.

    session = ort_session(path, threads=1)
    timing = latency_ms(lambda: run(session, batch_of(inputs, 32)), budget_s=1.0)  # {"median", "p90", "runs"} in ms
    timings = batch_latencies(inputs, lambda x: lambda: run(session, x), budget_s=1.0)  # {1: ..., 32: ...}
    metrics = evaluate_onnx(session, inputs, labels, task="classification")

Timing: a few warm-up runs, then runs until `budget_s` has passed (at least `min_runs`); each run is timed
alone with perf_counter. Only ratios between variants measured in the same process mean much on a
shared machine; the table shows both.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from trainforge.compression.artifact import INPUT_NAME
from trainforge.tasks import TASKS

BENCH_BATCHES = (1, 32)  # the batch sizes every variant is timed at (table columns b1, b32)


def ort_session(path: Path, threads: int) -> Any:
    """An onnxruntime CPU session with `threads` intra-op threads and sequential execution."""
    import onnxruntime as ort  # heavy (onnxruntime): loaded only when a variant is timed

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(session: Any, x: np.ndarray) -> np.ndarray:
    return session.run(None, {INPUT_NAME: x})[0]


def latency_ms(call: Callable[[], Any], *, budget_s: float = 1.0, min_runs: int = 10, warmup: int = 3) -> dict[str, float]:
    """Median and 90th-percentile wall time of `call()` (one complete inference), in milliseconds."""
    for _ in range(warmup):
        call()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < min_runs or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1e3
    return {"median": float(np.median(ms)), "p90": float(np.percentile(ms, 90)), "runs": len(times)}


def batch_of(inputs: Any, size: int) -> Any:
    """`size` real samples (repeated when the split is smaller): of an array, or of each array of a feeds dict."""
    if isinstance(inputs, dict):
        return {k: batch_of(v, size) for k, v in inputs.items()}
    reps = -(-size // len(inputs))
    return np.ascontiguousarray(np.concatenate([inputs] * reps)[:size])


def batch_latencies(inputs: Any, make_call: Callable[[np.ndarray], Callable[[], Any]], *,
                    budget_s: float) -> dict[int, dict[str, float]]:
    """{batch size: latency_ms(...)} for each of BENCH_BATCHES; `make_call(batch)` returns the call to time
    (one complete inference of that batch: ONNX Runtime, or a PyTorch model with its device synchronized)."""
    return {b: latency_ms(make_call(batch_of(inputs, b)), budget_s=budget_s) for b in BENCH_BATCHES}


def predict_all(session: Any, inputs: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Logits for every row of `inputs`, in batches."""
    return np.concatenate([run(session, inputs[i:i + batch_size]) for i in range(0, len(inputs), batch_size)])


def task_metrics(logits: np.ndarray, labels: np.ndarray, task: str) -> dict[str, Optional[float]]:
    """The task's quality columns (accuracy, or perplexity), plus the mean cross-entropy, from logits in numpy."""
    return TASKS.get(task).score_logits(logits, labels)


def variant_row(name: str, path: Path, runtime: str, params: int, flops: int, logits: np.ndarray, labels: np.ndarray,
                task: str, reference: np.ndarray, timings: dict[int, dict[str, float]]) -> dict[str, Any]:
    """One row of the before/after table (`compress --json` "variants"); `reference`: the logits of the
    PyTorch model the artifact came from, so max_abs_diff is the export error (fp32, pruned) or the
    quantization error (int8)."""
    return scored_row(name, path, runtime, params, flops, task_metrics(logits, labels, task),
                      float(np.abs(logits - reference).max()), timings)


def scored_row(name: str, path: Path, runtime: str, params: int, flops: int, scores: dict[str, Optional[float]],
               max_abs_diff: float, timings: dict[int, dict[str, float]]) -> dict[str, Any]:
    """One row of the table from the task's quality columns (`scores`) and the largest difference from the
    PyTorch model's outputs."""
    return {
        "name": name,
        "path": str(path),
        "runtime": runtime,
        "params": int(params),
        "flops": int(flops),
        "bytes": path.stat().st_size,
        **scores,
        "max_abs_diff": max_abs_diff,
        **timing_row(timings),
    }


def timing_row(timings: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The table's latency fields from {batch size: latency_ms(...)}."""
    return {
        "latency_ms": {f"b{b}": t["median"] for b, t in timings.items()},
        "latency_p90_ms": {f"b{b}": t["p90"] for b, t in timings.items()},
        "throughput_per_s": {f"b{b}": b / (t["median"] / 1e3) for b, t in timings.items()},
    }
