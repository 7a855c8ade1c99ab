"""Measuring a few real steps (`plan --calibrate`, `benchmarks/gpu_check.py`) in a run directory deleted at once."""
from __future__ import annotations

import trainforge
from trainforge.report import html
from trainforge.training.calibrate import measure_steps


def test_measured_steps_write_no_report_and_time_every_measured_step(monkeypatch):
    written = []
    monkeypatch.setattr(html, "write_report", lambda *a, **k: written.append(a))  # plots nobody would see
    cfg = trainforge.load_config(None, ["model.name=mlp", "model.args={hidden: [16]}", "train.device=cpu",
                                        "train.micro_batch_size=16", "train.global_batch_size=16"])
    measured = measure_steps(cfg, steps=3, warmup=1)
    assert written == []
    assert measured.step_time_s > 0 and measured.samples_per_s > 0 and measured.reserved_bytes is None
