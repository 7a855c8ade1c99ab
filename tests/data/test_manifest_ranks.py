"""Under `--nproc-per-node 2` (the real launcher, gloo on the CPU) an image folder is scanned once: by the first
process that looks (the launcher's check), while the ranks wait on the manifest's lock and reuse it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import trainforge
from data_helpers import write_png

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # several processes, or timing: the machine to itself
SRC = str(Path(trainforge.__file__).resolve().parents[1])  # the ranks must import this tree, not an installed one


def test_two_ranks_scan_the_folder_once(tmp_path):
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        for i in range(16):
            write_png(tmp_path / "images" / name / f"{i}.png", rng, size=8)
    home = tmp_path / "home"
    env = dict(os.environ, TRAINFORGE_HOME=str(home), PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "trainforge", "train", "data.source=imagefolder", f"data.path={tmp_path / 'images'}",
           "data.args={image_size: 8}", "model.name=mlp", "model.args={hidden: [8]}", "train.device=cpu",
           "train.global_batch_size=8", "train.micro_batch_size=4", "train.max_steps=2", "train.early_stopping=null",
           "log.progress=false", "log.tensorboard=false", "log.report=false", "--run-dir", str(tmp_path / "run"),
           "--nproc-per-node", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifests = list((home / "manifests").glob("*.json"))
    assert len(manifests) == 1
    scans = json.loads(manifests[0].read_text())["scans"]
    assert [s["read"] for s in scans] == [32]  # one scan of the 32 files for the launcher and both ranks
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["manifest"]["status"] == "reused" and report["manifest"]["last_scan"]["read"] == 32
    assert report["dropped_at_run_time"] == {"decode_failed": 0, "examples": []}
    assert proc.stderr.count("data: manifest reused") == 1  # rank 0 speaks for the group
