"""LiDAR sources (issue 52): `kitti` and `pointclouds` read the same generated scenes to the same samples; cleaning
counts each reason exactly; a malformed label or calibration file is one line naming it."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from lidar_data import CLASSES, difficulty_of, make_scenes, split_names, write_kitti, write_openpcdet
from trainforge.config import DataConfig
from trainforge.data.sources import pointclouds
from trainforge.data.sources.pointclouds import in_range
from trainforge.errors import UserError

RANGE = [0.0, -25.6, -3.0, 40.96, 25.6, 1.0]  # objects stand 5-40 m away, within 40 degrees of ahead
ARGS = {"point_cloud_range": RANGE, "voxel_size": [0.32, 0.32, 4.0]}


@pytest.fixture(scope="module")
def drives(tmp_path_factory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("drives")
    scenes = make_scenes(12, seed=0)
    write_kitti(root / "kitti", scenes)
    write_openpcdet(root / "custom", scenes)
    write_openpcdet(root / "custom_bin", scenes, suffix=".bin")
    write_openpcdet(root / "custom_pcd", scenes, suffix=".pcd")
    return root, scenes


def pool_of(source: str, path: Path, **args):
    return getattr(pointclouds, source)(DataConfig(source=source, path=str(path), args={**ARGS, **args}), seed=0)


def test_kitti_and_openpcdet_layouts_give_the_same_samples(drives):
    root, scenes = drives
    kitti = pool_of("kitti", root / "kitti")
    assert kitti.info.task == "detection3d" and kitti.info.modality == "pointcloud"
    assert kitti.info.class_names == CLASSES and kitti.drops.total == 0 and kitti.notes["dont_care"] == 12
    assert {k: v.tolist() for k, v in kitti.splits.items()} == {
        s: [int(n) for n in names] for s, names in split_names(12).items()}
    for layout in ("custom", "custom_bin", "custom_pcd"):
        other = pool_of("pointclouds", root / layout)
        assert len(other.samples) == len(kitti.samples) == 12 and other.drops.total == 0
        assert {k: v.tolist() for k, v in other.splits.items()} == {k: v.tolist() for k, v in kitti.splits.items()}
        for i, scene in enumerate(scenes):
            (points_a, target_a), (points_b, target_b) = kitti.samples[i], other.samples[i]
            assert np.array_equal(points_a.numpy(), points_b.numpy()), (layout, i)
            assert np.abs(target_a["boxes"].numpy() - target_b["boxes"].numpy()).max(initial=0) < 1e-5, (layout, i)
            assert target_a["labels"].tolist() == target_b["labels"].tolist() == [CLASSES.index(n) for n in scene.names]
    for i, scene in enumerate(scenes):  # and they are the scene's: its boxes, its points in range, its difficulty
        points, target = kitti.samples[i]
        assert np.abs(target["boxes"].numpy() - scene.boxes).max(initial=0) < 1e-5
        assert np.array_equal(points.numpy(), scene.points[in_range(scene.points, RANGE)])
        assert target["difficulty"].tolist() == difficulty_of(scene).tolist()


def test_point_features_choose_the_columns(drives):
    root, scenes = drives
    xyz = pool_of("pointclouds", root / "custom", point_features=["x", "y", "z"])
    points, _ = xyz.samples[0]
    assert points.shape[1] == 3 and np.array_equal(points.numpy(), scenes[0].points[in_range(scenes[0].points, RANGE)][:, :3])
    with pytest.raises(UserError, match="data.args.point_features"):
        pool_of("pointclouds", root / "custom", point_features=["intensity", "x", "y", "z"])


def test_every_cleaning_reason_is_counted_exactly(drives, tmp_path):
    root, scenes = drives
    kitti = tmp_path / "kitti"
    shutil.copytree(root / "kitti", kitti)
    shutil.rmtree(kitti / "ImageSets")
    (kitti / "velodyne" / "000000.bin").write_bytes(b"\x00" * 30)          # unreadable_points: not whole records
    (kitti / "velodyne" / "000001.bin").unlink()                           # missing_points
    (kitti / "label_2" / "000002.txt").unlink()                            # missing_labels
    (kitti / "calib" / "000003.txt").unlink()                              # missing_calib
    calib = (kitti / "calib" / "000004.txt").read_text().splitlines()
    calib[4] = "R0_rect: " + " ".join(["0"] * 9)                            # singular_calib
    (kitti / "calib" / "000004.txt").write_text("\n".join(calib) + "\n")
    far = scenes[5].points.copy()
    far[:, 0] += 500                                                       # empty_frame: nothing in range
    far.tofile(kitti / "velodyne" / "000005.bin")
    points = scenes[6].points.copy()
    points[:7, 0] = np.nan                                                 # nonfinite_points: 7, frame kept
    points[7:9, 2] = np.inf
    points.tofile(kitti / "velodyne" / "000006.bin")
    lines = (kitti / "label_2" / "000007.txt").read_text().splitlines()
    first = lines[0].split()
    lines += ["Car 0 0 oops", "Van " + " ".join(first[1:]),                # bad_label_line, unknown_class
              " ".join([first[0], *first[1:8], "0", *first[9:]]),          # bad_size: h 0
              " ".join([first[0], *first[1:11], "-30", first[12], "80", first[14]])]  # out_of_range: 80 m ahead
    (kitti / "label_2" / "000007.txt").write_text("\n".join(lines) + "\n")
    pool = pool_of("kitti", kitti)
    want = {"unreadable_points": 1, "missing_points": 1, "missing_labels": 1, "missing_calib": 1,
            "singular_calib": 1, "empty_frame": 1, "nonfinite_points": 9, "bad_label_line": 1, "unknown_class": 1,
            "bad_size": 1, "out_of_range": 1}
    assert pool.drops.counts == want
    assert len(pool.samples) == 12 - 6 and pool.rows_read == 12  # six frames dropped, each for one reason
    kept = {Path(f).stem: i for i, f in enumerate(pool.samples.files)}
    points6, _ = pool.samples[kept["000006"]]
    assert np.array_equal(points6.numpy(), points[in_range(points, RANGE)])  # the 9 non-finite points left out
    assert len(points6) == in_range(scenes[6].points, RANGE).sum() - in_range(scenes[6].points[:9], RANGE).sum()
    _, target7 = pool.samples[kept["000007"]]
    assert len(target7["boxes"]) == len(scenes[7].boxes)  # the four bad lines dropped, the frame's own kept


@pytest.mark.parametrize("case", ["binary_label", "no_line_parses", "calib_format", "image_sets_path"])
def test_a_malformed_file_is_one_line_naming_it(drives, tmp_path, case):
    root, _ = drives
    kitti = tmp_path / "kitti"
    shutil.copytree(root / "kitti", kitti)
    file = {"binary_label": kitti / "label_2" / "000003.txt", "no_line_parses": kitti / "label_2" / "000004.txt",
            "calib_format": kitti / "calib" / "000005.txt", "image_sets_path": kitti / "ImageSets" / "val.txt"}[case]
    file.write_bytes({"binary_label": b"\xff\xfe\x00garbage", "no_line_parses": b"Car 1 2 3\nPedestrian x y\n",
                      "calib_format": b"P2: 1 2 3\nR0_rect: 1 0 0 0 1 0 0 0 1\n",
                      "image_sets_path": b"000010\n../../etc/passwd\n"}[case])
    with pytest.raises(UserError) as e:
        pool_of("kitti", kitti)
    assert str(file) in str(e.value) and "\n" not in str(e.value)


def test_a_malformed_label_file_through_trainforge_train_is_one_line_exit_2_and_nothing_written(drives, tmp_path,
                                                                                                  capsys):
    """Acceptance 4 through the command line: the user's run directory is not created, the folder is untouched."""
    from trainforge.cli import main

    root, _ = drives
    kitti = tmp_path / "kitti"
    shutil.copytree(root / "kitti", kitti)
    bad = kitti / "label_2" / "000003.txt"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    before = sorted((p.relative_to(kitti), p.stat().st_size) for p in kitti.rglob("*"))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as code:
        main(["train", "data.source=kitti", f"data.path={kitti}", "model.name=pointpillars",
              f"data.args={{point_cloud_range: {RANGE}, voxel_size: [0.32, 0.32, 4]}}", "--run-dir", str(run)])
    assert code.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(bad) in err and "Traceback" not in err, err
    assert not run.exists()
    assert sorted((p.relative_to(kitti), p.stat().st_size) for p in kitti.rglob("*")) == before
