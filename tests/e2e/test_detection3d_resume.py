"""3D detection's exact resume and data parallelism (issue 52, acceptance 5), through the recipe `pointpillars_kitti`
with ground-truth sampling and the three global augmentations on: a run SIGKILLed twice mid-epoch and resumed ends
bit-identical to one never interrupted (weights, every step's loss, eval.json); two processes match one process
accumulating the same micro-batches within 1e-5.

Why "accumulating the same micro-batches" rather than one micro-batch of twice the size: PointPillars normalizes by
batch statistics (each rank's, as in every data-parallel run without SyncBatchNorm), so the step of one process on
8 frames differs from two processes on 4 each by the statistics alone; one process accumulating two micro-batches of
4 computes exactly what the two ranks compute."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from lidar_data import make_scenes, write_kitti
from test_crash_resume import assert_killed_run_matches_uninterrupted, launch, two_process_losses, wait_for_progress

RECIPE = "pointpillars_kitti"
SMALL = ["data.args.max_points_per_voxel=8", "data.args.point_cloud_range=[0, -25.6, -3, 40.96, 25.6, 1]",
         "data.args.voxel_size=[0.64, 0.64, 4]", "data.args.max_voxels=[3000, 4000]",
         "model.args={pillar_channels: 16, channels: [16, 32, 32], layers: [1, 1, 1], up_channels: 16, "
         "head_channels: 16}", "schedule.warmup_steps=2", "train.early_stopping=null", "log.progress=false",
         "log.tensorboard=false", "train.num_threads=1", "train.log_every_steps=1"]


@pytest.fixture(scope="module")
def drives(tmp_path_factory) -> Path:
    return write_kitti(tmp_path_factory.mktemp("drives") / "kitti", make_scenes(16, seed=5))


@pytest.mark.slow
@pytest.mark.serial  # bit-identity is measured with the machine to itself, as for the other families
def test_a_pointpillars_run_with_gt_sampling_sigkilled_twice_resumes_bit_identical(drives, tmp_path):
    args = [f"data.path={drives}", *SMALL, "data.num_workers=1", "train.max_steps=16", "train.global_batch_size=4",
            "train.micro_batch_size=2", "train.checkpoint_every_steps=2", "train.eval_every_steps=8"]
    assert_killed_run_matches_uninterrupted(RECIPE, args, tmp_path, steps=16)


@pytest.mark.slow
@pytest.mark.serial
def test_two_processes_on_pointpillars_match_one_accumulating_the_same_micro_batches(drives, tmp_path):
    common = [f"data.path={drives}", *SMALL, "data.num_workers=0", "train.max_steps=5", "train.global_batch_size=4",
              "train.micro_batch_size=2", "train.eval_every_steps=5"]
    losses = two_process_losses(RECIPE, common, common, tmp_path)
    assert len(losses[0]) == 5
    np.testing.assert_allclose(losses[1], losses[0], atol=1e-5, rtol=0)


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")
def test_a_sigkilled_trainer_takes_its_data_workers_with_it(drives, tmp_path):
    """The OOM killer or `kill -9` on a trainer: its DataLoader workers die with it at once (PR_SET_PDEATHSIG), not
    after torch's 5-second check of the parent, nor never (a worker blocked on a full pipe never checks)."""
    run = tmp_path / "run"
    proc = launch(run, [RECIPE, f"data.path={drives}", *SMALL, "data.num_workers=2", "train.max_steps=500",
                        "train.global_batch_size=2", "train.micro_batch_size=2", "train.checkpoint_every_steps=1"])
    try:
        assert wait_for_progress(proc, run)
        workers = children_of(proc.pid)
        assert len(workers) >= 2, workers
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 2.0  # torch's own check of the parent waits 5 s (MP_STATUS_CHECK_INTERVAL)
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [w for w in workers if alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, f"data workers {left} outlived their SIGKILLed trainer"
