"""CT volumes end to end (issue 29): MONAI's 3D DenseNet learns spheres from cubes on generated NIfTI and DICOM data
split by patient; the second start decodes no volume; compress exports it to ONNX and `trainforge predict` serves a
NIfTI file; a run SIGKILLed mid-epoch resumes bit-identical; two processes match one accumulating the same
micro-batches."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import trainforge
from test_crash_resume import assert_killed_run_matches_uninterrupted, two_process_losses
from trainforge.cli import main
from volume_data import write_patients

SMALL_NET = ["model.args={arch: DenseNet, init_features: 16, growth_rate: 8, block_config: [2, 2, 2]}"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path / "home"))


@pytest.mark.slow
def test_a_3d_densenet_learns_spheres_from_cubes_split_by_patient_and_serves_a_nifti_file(tmp_path, capsys):
    index = write_patients(tmp_path / "data", patients=30, size=24, seed=0)
    overrides = [f"data.path={index}", "data.args.size=[24, 24, 24]", "data.args.spacing=[1.0, 1.0, 1.5]",
                 *SMALL_NET, "optim.lr=0.002", "train.epochs=40", "train.global_batch_size=16",
                 "train.micro_batch_size=16", "schedule.warmup_steps=10", "train.eval_every_steps=40",
                 "train.early_stopping=null", "log.progress=false", "log.tensorboard=false"]
    run = tmp_path / "run"
    assert trainforge.train(trainforge.load_config("ct_classification", overrides), run_dir=run).status == "completed"
    ev = json.loads((run / "eval.json").read_text())
    assert ev["balanced_accuracy"] > 0.9, ev  # chance: 0.5
    assert ev["auroc"] > 0.9 and set(ev) >= {"auroc", "sensitivity", "specificity", "balanced_accuracy"}
    assert ev["roc_curves"]["sphere"]["tpr"][-1] == 1.0
    report = json.loads((run / "data_report.json").read_text())
    assert report["group_by"] == "patient_id" and sum(report["groups_per_split"].values()) == 30
    assert report["volume_cache"]["decoded"] == report["rows_read"]
    from PIL import Image

    picture = Image.open(run / "val_images.png")  # the validation volumes' middle slices, framed right or wrong
    assert picture.size[0] == 4 * 136 and picture.size[1] in (136, 272)
    html = (run / "report.html").read_text()
    assert 'id="roc-curves"' in html and 'id="val-images"' in html

    again = tmp_path / "again"  # a second start: every volume from the cache
    cfg = trainforge.load_config("ct_classification", [*overrides, "train.max_steps=1", "train.eval_every_steps=1"])
    assert trainforge.train(cfg, run_dir=again).status == "completed"
    cache = json.loads((again / "data_report.json").read_text())["volume_cache"]
    assert cache["decoded"] == 0 and cache["cached"] == report["rows_read"]

    with pytest.raises(SystemExit) as code:
        main(["compress", str(run), "--bench-seconds", "0.2", "--calibration-samples", "8", "--json"])
    assert code.value.code in (0, None)
    rows = {v["name"]: v for v in json.loads(capsys.readouterr().out)["variants"]}
    assert rows["fp32"]["max_abs_diff"] < 1e-3
    assert rows["fp32"]["accuracy"] == pytest.approx(ev["accuracy"], abs=1e-6)

    files = [str(p) for p in sorted((tmp_path / "data" / "p1").glob("*.nii.gz"))]
    with pytest.raises(SystemExit) as code:
        main(["predict", str(run / "compressed"), *files, "--variant", "fp32", "--json"])
    assert code.value.code in (0, None)
    predicted = json.loads(capsys.readouterr().out)["predictions"]
    truth = {line.split(",")[0]: line.split(",")[1] for line in index.read_text().splitlines()[1:]}
    for p in predicted:
        assert p["label"] == truth[str(Path(p["input"]).relative_to(tmp_path / "data"))], p

    png = tmp_path / "scan.png"
    from PIL import Image

    Image.fromarray(np.zeros((8, 8), np.uint8)).save(png)
    with pytest.raises(SystemExit) as code:
        main(["predict", str(run / "compressed"), str(png)])
    assert code.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "INPUT:" in err and "is not a NIfTI file" in err and len(err.splitlines()) == 1


TINY = ["data.args.size=[12, 12, 12]", "data.args.spacing=null", "data.augment={hflip: 0.5, dflip: 0.5, "
        "intensity_shift: 0.1}", "model.args={arch: DenseNet, init_features: 8, growth_rate: 4, block_config: [2, 2]}",
        "log.progress=false", "log.tensorboard=false", "train.early_stopping=null", "data.num_workers=0",
        "train.num_threads=1"]  # the in-process reference and the CLI runs: the same kernels, whatever ran before


@pytest.fixture
def tiny_volumes(tmp_path) -> Path:
    return write_patients(tmp_path / "data", patients=8, size=12, seed=1)


@pytest.mark.slow
@pytest.mark.serial  # bit-identity is measured with the machine to itself (MKL may use fewer threads when it is busy)
def test_a_3d_model_run_sigkilled_mid_epoch_resumes_bit_identical(tiny_volumes, tmp_path):
    args = [f"data.path={tiny_volumes}", *TINY, "train.max_steps=24", "train.global_batch_size=4",
            "train.micro_batch_size=2", "train.checkpoint_every_steps=3", "train.eval_every_steps=12",
            "train.log_every_steps=1"]
    assert_killed_run_matches_uninterrupted("ct_classification", args, tmp_path, steps=24)


@pytest.mark.slow
@pytest.mark.serial  # bit-identity and 1e-5 are measured with the machine to itself, as for the segmenter
def test_two_processes_on_a_3d_model_match_one_accumulating_the_same_micro_batches(tiny_volumes, tmp_path):
    # BatchNorm normalizes each micro-batch by its own statistics: one process accumulating two micro-batches of 2
    # is the computation two processes of 2 make, one micro-batch of 4 is not
    common = [f"data.path={tiny_volumes}", *TINY, "train.max_steps=6", "train.global_batch_size=4",
              "train.micro_batch_size=2", "train.eval_every_steps=6", "train.log_every_steps=1"]
    losses = two_process_losses("ct_classification", common, common, tmp_path)
    assert len(losses[0]) == 6
    np.testing.assert_allclose(losses[1], losses[0], atol=1e-5, rtol=0)


@pytest.mark.slow
def test_a_3d_unet_trained_on_patches_segments_whole_volumes_exports_and_serves_a_nifti_file(tmp_path, capsys):
    """Trained on 16^3 patches, evaluated on the whole 24^3 volumes by sliding windows; compress exports the network
    at the whole volume's size, and predict serves a NIfTI file."""
    from volume_data import write_lesions

    index = write_lesions(tmp_path / "data", patients=12, size=24, seed=0)
    run = tmp_path / "seg"
    cfg = trainforge.load_config("ct_segmentation", [
        f"data.path={index}", "data.args.size=[24, 24, 24]", "data.args.patch=[16, 16, 16]", "data.args.spacing=null",
        "train.epochs=20", "train.global_batch_size=4", "train.micro_batch_size=4", "log.progress=false",
        "log.tensorboard=false"])
    assert trainforge.train(cfg, run_dir=run).status == "completed"
    ev = json.loads((run / "eval.json").read_text())
    assert ev["dice"] > 0.8 and ev["per_class"]["lesion"]["dice"] > 0.7, ev  # background alone: dice ~0.5
    assert 0 <= ev["hd95_voxels"] < 4
    report = json.loads((run / "data_report.json").read_text())
    assert report["voxels_per_class"]["lesion"] > 0 and sum(report["groups_per_split"].values()) == 12
    assert (run / "val_images.png").is_file()  # the middle slices: image, true mask, predicted mask

    with pytest.raises(SystemExit) as code:
        main(["compress", str(run), "--quantize", "none", "--bench-seconds", "0.2", "--json"])
    assert code.value.code in (0, None)
    (fp32,) = json.loads(capsys.readouterr().out)["variants"]
    assert fp32["max_abs_diff"] < 1e-3 and fp32["miou"] == pytest.approx(ev["miou"], abs=1e-3)

    scan = str(tmp_path / "data" / "p0" / "ct0.nii.gz")
    with pytest.raises(SystemExit) as code:
        main(["predict", str(run / "compressed"), scan, "--images", str(tmp_path / "drawn"), "--json"])
    assert code.value.code in (0, None)
    (p,) = json.loads(capsys.readouterr().out)["predictions"]
    assert p["shape"] == [24, 24, 24] and set(p["classes"]) <= {"background", "lesion"}
    assert 0 < p["classes"].get("lesion", 0) < 0.5 and Path(p["image"]).is_file()
    assert Path(p["image"]).name == "ct0.png"  # the middle slice's picture names its scan (issue 55)
