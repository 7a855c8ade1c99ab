"""LiDAR 3D detection end to end (issue 52, so far): a KITTI folder of generated drives trains a small PointPillars
through `trainforge.train`; the data line says frames, the pillars the collate makes are the fixed training cap,
eval.json holds map_bev, map_3d, map_center and per_class (by KITTI difficulty), and the loss falls."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import trainforge
from lidar_data import CLASSES, make_scenes, write_kitti
from trainforge.data import build_data
from trainforge.metrics_file import read_metrics
from trainforge.tasks import task_of

DATA_ARGS = ("data.args={point_cloud_range: [0, -25.6, -3, 40.96, 25.6, 1], voxel_size: [0.64, 0.64, 4], "
             "max_points_per_voxel: 8, max_voxels: [3000, 4000]}")
SMALL = ("model.args={pillar_channels: 16, channels: [16, 32, 32], layers: [1, 1, 1], up_channels: 16, "
         "head_channels: 16}")


def overrides(root: Path, *extra: str) -> list[str]:
    return ["data.source=kitti", f"data.path={root}", "model.name=pointpillars", DATA_ARGS, SMALL, "optim.name=adamw",
            "optim.lr=0.003", "schedule={name: cosine, warmup_steps: 5}", "train.global_batch_size=4",
            "train.micro_batch_size=4", "train.early_stopping=null", "log.progress=false", "log.tensorboard=false",
            "log.report=false", *extra]


@pytest.fixture(scope="module")
def drives(tmp_path_factory) -> Path:
    return write_kitti(tmp_path_factory.mktemp("drives") / "kitti", make_scenes(20, seed=0))


def test_the_collate_pads_training_to_its_cap_and_evaluation_to_the_batch(drives):
    cfg = trainforge.load_config(None, overrides(drives))
    data = build_data(cfg.data, seed=0)
    assert data.info.pillar_grid[9:] == (8, 3000, 4000)
    task = task_of(data.info)
    train = task.collator(data.info, train=True)([data.train[(0, 0)], data.train[(0, 1)]])
    evaluation = task.collator(data.info, train=False)([data.val[0]])
    assert train[0]["voxels"].shape == (2, 3000, 8, 4) and train[1]["heatmap"].shape == (2, 3, 40, 32)
    v = int((evaluation[0]["counts"] > 0).sum())
    assert evaluation[0]["voxels"].shape == (1, v, 8, 4) and 100 < v <= 4000  # the frame's own pillars
    assert len(evaluation[2]) == 1 and evaluation[2][0]["boxes"].shape[1] == 7


def test_a_small_pointpillars_trains_and_reports_kittis_and_nuscenes_metrics(drives, tmp_path, capsys):
    cfg = trainforge.load_config(None, overrides(drives, "train.max_steps=30", "train.eval_every_steps=15",
                                                 "train.log_every_steps=1"))
    run = tmp_path / "run"
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    said = capsys.readouterr()
    assert "data: 20 frames read, 20 kept" in said.out + said.err
    ev = json.loads((run / "eval.json").read_text())
    assert {"map_bev", "map_3d", "map_center", "per_class"} <= set(ev) and "loss" not in ev
    assert set(ev["per_class"]) == set(CLASSES)
    assert {"ap_bev_easy", "ap_bev_moderate", "ap_bev_hard", "ap_center_4m"} <= set(ev["per_class"]["Car"])
    rows = read_metrics(run / "metrics.jsonl")
    losses = [r["loss"] for r in rows if r["split"] == "train"]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses  # the heatmap's focal loss falls fast
    val = [r for r in rows if r["split"] == "val"]
    assert [r["step"] for r in val] == [15, 30] and all("map_bev" in r and "per_class" not in r for r in val)
