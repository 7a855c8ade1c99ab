"""The planner against a real GPU: the same code paths the CPU tests cover, checked on hardware."""
from __future__ import annotations

import json

import pytest
import torch

import trainforge
from trainforge.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_calibration_on_the_gpu_stores_time_and_memory_factors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path))
    with pytest.raises(SystemExit):
        main(["plan", "charlm_gpt", "data.args.max_bytes=300000", "train.device=cuda", "--calibrate", "--json"])
    entry = json.loads(capsys.readouterr().out)
    assert entry["measured_peak_bytes"] > 0 and entry["memory_factor"] > 0


def test_predicted_peak_within_10_percent_of_reserved(tmp_path):
    from trainforge.hardware.catalog import load_catalog
    from trainforge.planning.plan import plan_local_step

    cfg = trainforge.load_config("charlm_gpt", ["data.args.max_bytes=300000", "train.max_steps=6", "train.device=cuda",
                                                "log.progress=false", "train.early_stopping=null"])
    torch.cuda.reset_peak_memory_stats()
    result = trainforge.train(cfg, run_dir=tmp_path / "run")
    reserved = torch.cuda.max_memory_reserved()
    predicted = plan_local_step(cfg, torch.device("cuda"), load_catalog(), micro_batch_size=result.micro_batch_size,
                                precision=result.setup.precision, calibration={})
    assert predicted.simulated_peak_bytes_per_gpu == pytest.approx(torch.cuda.max_memory_allocated(), rel=0.10)
    assert predicted.peak_bytes_per_gpu - 512 * 2**20 == pytest.approx(reserved, rel=0.25)  # context not in reserved


def test_auto_micro_batch_on_the_gpu_fits(tmp_path):
    cfg = trainforge.load_config("digits_cnn", ["train.micro_batch_size=auto", "train.device=cuda", "train.max_steps=2",
                                                "log.progress=false"])
    result = trainforge.train(cfg, run_dir=tmp_path / "run")
    assert result.micro_batch_size == 64  # digits fits whole on any GPU
