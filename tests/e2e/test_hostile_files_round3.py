"""Files someone else made, round 3 (issue 50, Medium 4-11 and Low): each is built here and run through the real
command line. Each gives exit 2 and one line naming the file or field, or is dropped and counted in
data_report.json; no traceback anywhere. The ones that used to cost memory (a UTF-16 entity bomb, volumes whose
header or spacing claims gigabytes, a Parquet index of 20 M rows, a mask value of 2e9) run in a child process whose
own peak RSS (`os.wait4`'s rusage of that child) stays under 3 GB."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trainforge.cli import main
from volume_data import (nibabel_example_4d, shape_volume, write_dicom_series, write_header_only_nifti,
                         write_nifti)

QUICK = ["train.max_steps=2", "train.global_batch_size=4", "train.micro_batch_size=4", "train.eval_every_steps=2",
         "train.early_stopping=null", "schedule.warmup_steps=0", "data.num_workers=0", "train.device=cpu",
         "log.progress=false", "log.tensorboard=false", "log.report=false"]
IMAGES = ["data.source=imagefolder", "data.args={image_size: 8}", "data.normalize=none",
          "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "model.name=mlp", "model.args={hidden: [8]}"]
MAX_RSS_BYTES = 3 * 2**30


def png(path: Path, value: int = 0) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (value, 0, 0)).save(path)
    return path.name


def image_rows(root: Path, n: int = 24) -> list[dict]:
    return [{"path": f"img/{png(root / 'img' / f'{i}.png', i * 9)}", "label": ("a", "b")[i % 2]} for i in range(n)]


def bomb_xml(encoding: str = "utf-16") -> bytes:
    """Billion laughs: 10 levels of 10 references, 10**10 characters if expanded, in UTF-16 (no ASCII '<!DOCTYPE')."""
    entities = '<!ENTITY l0 "laughlaugh">' + "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    text = (f'<?xml version="1.0" encoding="{encoding.upper()}"?><!DOCTYPE a [{entities}]>'
            "<annotation><filename>&l9;</filename></annotation>")
    return text.encode(encoding)


# ------------------------------------------------------------------------------------- one line, exit 2, in process

def coco(root: Path, images: list[dict], categories: list[dict], name: str = "a.png") -> Path:
    png(root / "images" / name)
    (root / "annotations.json").write_text(json.dumps({"images": images, "annotations": [], "categories": categories}))
    return root


def case_files(root: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (the command's arguments after `train`, what its one line says)."""
    cases: dict[str, tuple[list[str], str]] = {}
    cat = [{"id": 1, "name": "box"}]
    det = ["coco_detection_finetune", "data.args.image_size=64"]
    big = root / "coco-bigint"
    png(big / "images" / "a.png")
    big.joinpath("annotations.json").write_text('{"images": [{"id": ' + "9" * 5000 + ', "file_name": "a.png"}], '
                                                '"annotations": [], "categories": [{"id": 1, "name": "box"}]}')
    cases["coco 5000-digit integer"] = ([*det, f"data.path={big}"], "annotations.json: not a COCO file")
    for label, ident in (("list", [1]), ("text list", ["a"]), ("dict", {"a": 1})):
        folder = coco(root / f"coco-cat-{label}", [{"id": 1, "file_name": "a.png"}], [{"id": ident, "name": "box"}])
        cases[f"coco category id a {label}"] = ([*det, f"data.path={folder}"], "categories[0].id is")
    folder = coco(root / "coco-longname", [{"id": 1, "file_name": "x" * 5000 + ".png"}], cat)
    cases["coco 5000-character file_name"] = ([*det, f"data.path={folder}"], "is not a file name")

    yolo = root / "yolo-deep"
    (yolo / "images").mkdir(parents=True)
    (yolo / "data.yaml").write_text("names: " + "[" * 20000 + "]" * 20000 + "\n")
    cases["yolo data.yaml nested 20000 levels"] = ([*det, "data.source=yolo", f"data.path={yolo}"], "nested deeper")
    fifo = root / "yolo-fifo"
    (fifo / "images").mkdir(parents=True)
    os.mkfifo(fifo / "data.yaml")
    cases["yolo data.yaml a FIFO"] = ([*det, "data.source=yolo", f"data.path={fifo}"], "not a regular file")

    rows = image_rows(root / "idx")
    csv_rows = "path,label\n" + "".join(f"{r['path']},{r['label']}\n" for r in rows)
    (root / "idx" / "long-field.csv").write_text(csv_rows + "img/" + "x" * (200 << 10) + ".png,a\n")
    cases["csv field over 128 KiB"] = (["digits_cnn", *IMAGES, f"data.path={root / 'idx' / 'long-field.csv'}"],
                                       "is not a path")
    (root / "idx" / "nul.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows)
                                            + json.dumps({"path": "img/0.png\u0000x", "label": "a"}) + "\n")
    cases["a NUL byte in a path"] = (["digits_cnn", *IMAGES, f"data.path={root / 'idx' / 'nul.jsonl'}"],
                                     "is not a path")

    drives = root / "drives"
    from multimodal_data import write_drives

    index = write_drives(drives, 24, seed=0, side=8)
    text = index.read_text().splitlines()
    text[1] = "camera/" + "c" * 5000 + ".png" + text[1][text[1].index(","):]
    (drives / "long.csv").write_text("\n".join(text) + "\n")
    cases["multimodal 5000-character image path"] = (
        ["fusion_classifier", f"data.path={drives / 'long.csv'}", "data.args.image_size=8", "model.args.width=16"],
        "is not a path")

    masks = root / "masks"
    (masks / "masks").mkdir(parents=True)
    for i in range(4):
        png(masks / "images" / f"{i}.png", i)
        Image.fromarray(np.zeros((8, 8), np.uint8), mode="L").save(masks / "masks" / f"{i}.png")
    for label, array, mode, says in (("a TIFF of mode I with -1", np.full((8, 8), -1, np.int32), "I", "values -1"),
                                     ("a TIFF of mode F with NaN", np.full((8, 8), np.nan, np.float32), "F",
                                      "of float32 values"),
                                     ("a value of 2e9", np.full((8, 8), 2_000_000_000, np.int32), "I",
                                      "values 2000000000")):
        folder = root / f"masks-{mode}-{len(cases)}"
        shutil.copytree(masks, folder)
        Image.fromarray(array, mode=mode).save(folder / "masks" / "0.png", format="TIFF")  # a TIFF named .png
        cases[f"mask: {label}"] = (["segmentation_finetune", "data.source=masks", f"data.path={folder}",
                                    "data.args={classes: [background, box], image_size: 8}"], says)
    return cases


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, tuple[list[str], str]]:
    return case_files(tmp_path_factory.mktemp("hostile3"))


NAMES = ["coco 5000-digit integer", "coco category id a list", "coco category id a text list", "coco category id a dict",
         "coco 5000-character file_name", "yolo data.yaml nested 20000 levels", "yolo data.yaml a FIFO",
         "csv field over 128 KiB", "a NUL byte in a path", "multimodal 5000-character image path",
         "mask: a TIFF of mode I with -1", "mask: a TIFF of mode F with NaN", "mask: a value of 2e9"]


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_file_is_one_line_and_exit_2(name, cases, tmp_path, capsys):
    args, says = cases[name]
    with pytest.raises(SystemExit) as exit_:
        main(["train", *args, *QUICK, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_.value.code == 2 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and says in lines[0] and len(lines[0]) < 1000, err[-3000:]


# ----------------------------------------------------------------- dropped and counted, the run goes on

def test_rows_that_are_no_record_are_dropped_and_counted(tmp_path, capsys):
    rows = image_rows(tmp_path)
    lines = [json.dumps(r) for r in rows]
    lines.append('{"path": "img/0.png", "label": ' + "9" * 5000 + "}")  # beyond Python's int digit limit
    lines.append("[" * 100_000 + "]" * 100_000)  # nested without end
    (tmp_path / "index.jsonl").write_text("\n".join(lines) + "\n")
    main_ok(["train", "digits_cnn", *IMAGES, f"data.path={tmp_path / 'index.jsonl'}", *QUICK,
             "--run-dir", str(tmp_path / "run")], capsys)
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["rows_read"] == len(rows) + 2 and sum(report["dropped"].values()) == 2, report["dropped"]


def test_a_feature_beyond_a_floats_range_is_missing_not_a_crash(tmp_path, capsys):
    from multimodal_data import write_drives

    index = write_drives(tmp_path / "drives", 32, seed=0, side=8)
    text = index.read_text().splitlines()
    head, first = text[0].split(","), text[1].split(",")
    first[head.index("speed")] = "9" * 400
    text[1] = ",".join(first)
    jsonl = tmp_path / "drives" / "index.jsonl"
    jsonl.write_text("".join(json.dumps({k: (int(v) if k == "speed" and len(v) == 400 else v)
                                         for k, v in zip(head, line.split(","))}) + "\n" for line in text[1:]))
    main_ok(["train", "fusion_classifier", f"data.path={jsonl}", "data.args.image_size=8", "model.args.width=16",
             "data.args.missing=drop", *QUICK, "--run-dir", str(tmp_path / "run")], capsys)
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["dropped"].get("missing_features") == 1, report["dropped"]


def test_a_lone_surrogate_in_a_coco_file_name_trains_and_writes_the_report(tmp_path, capsys):
    """The name a file gave is written escaped (report.html, eval.json): the run ends 0, its report in place."""
    root = tmp_path / "coco"
    names = ["img\udcff.png", *(f"{i}.png" for i in range(11))]
    (root / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in names:
        pixels = np.zeros((64, 64, 3), np.uint8)
        pixels[16:40, 16:40] = 200
        Image.fromarray(np.clip(pixels + rng.integers(0, 20, pixels.shape), 0, 255).astype(np.uint8)).save(
            os.fsencode(root / "images") + b"/" + os.fsencode(name), format="PNG")
    doc = {"images": [{"id": i, "file_name": n} for i, n in enumerate(names)],
           "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [16, 16, 24, 24]}
                           for i in range(len(names))],
           "categories": [{"id": 1, "name": "box\udcff"}]}
    (root / "annotations.json").write_text(json.dumps(doc))  # ensure_ascii: the surrogate as \udcff
    small = ("model.args={arch: fasterrcnn_resnet50_fpn, backbone: resnet18, pretrained: false, "
             "anchor_sizes: [8, 16, 32, 64, 128], options: {rpn_pre_nms_top_n_train: 50, rpn_post_nms_top_n_train: "
             "20, rpn_pre_nms_top_n_test: 50, rpn_post_nms_top_n_test: 10, box_batch_size_per_image: 8}}")
    main_ok(["train", "coco_detection_finetune", f"data.path={root}", "data.args.image_size=64", small, "data.augment={}",
             *[q for q in QUICK if q != "log.report=false"], "train.global_batch_size=2", "train.micro_batch_size=2",
             "--run-dir", str(tmp_path / "run")], capsys)
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "eval.json").is_file()


def main_ok(args: list[str], capsys) -> None:
    try:
        main(args)
    except SystemExit as e:
        err = capsys.readouterr().err
        assert e.code in (0, None), err[-3000:]


# ------------------------------------------------------------- what used to cost gigabytes: in a child, its RSS

def run_child(args: list[str], tmp_path: Path) -> tuple[int, str, int]:
    """`trainforge train ARGS` in a child process: (exit code, stderr, the child's own peak RSS in bytes)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with open(tmp_path / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trainforge", "train", *args, *QUICK,
                                 "--run-dir", str(tmp_path / "run")], stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "TRAINFORGE_HOME": str(tmp_path / "home")})
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    print(f"{args[0]} {args[-1][:60]}: exit {proc.returncode}, peak RSS {usage.ru_maxrss / 1024:.0f} MiB")
    return proc.returncode, (tmp_path / "stderr.txt").read_text(errors="replace"), usage.ru_maxrss * 1024


def volumes_index(root: Path) -> Path:
    rng = np.random.default_rng(0)
    rows = ["path,label,patient_id"]
    for k in range(8):
        kind = ("sphere", "cube")[k % 2]
        write_nifti(root / f"good{k}.nii.gz", shape_volume(kind, rng, size=12), (1.0, 1.0, 1.0))
        rows.append(f"good{k}.nii.gz,{kind},P{k}")
    write_nifti(root / "coarse.nii.gz", shape_volume("cube", rng, size=8), (100.0, 100.0, 100.0))
    write_dicom_series(root / "coarse_series", shape_volume("cube", rng, size=8), (100.0, 100.0, 100.0),
                       patient_id="P9")
    write_header_only_nifti(root / "claims.nii.gz", (2048, 2048, 512), (1.0, 1.0, 1.0))
    shutil.copy(nibabel_example_4d(), root / "example4d.nii.gz")
    rows += ["coarse.nii.gz,cube,P8", "coarse_series,cube,P9", "claims.nii.gz,cube,P10", "example4d.nii.gz,sphere,P11"]
    (root / "index.csv").write_text("\n".join(rows) + "\n")
    return root / "index.csv"


def test_files_that_claimed_gigabytes_cost_a_child_under_3_gb(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # volumes: 100 mm voxels resampled to 1 mm (NIfTI and DICOM), a header claiming 4 GiB, a real 4-D NIfTI
    index = volumes_index(tmp_path / "vol")
    code, err, rss = run_child(["ct_classification", f"data.path={index}", "data.args.size=[32,32,32]",
                                "data.args.spacing=[1,1,1]", "data.args.window=null",
                                "model.args={arch: DenseNet121, init_features: 4, growth_rate: 4}"], tmp_path / "a")
    assert code == 0 and "Traceback" not in err and rss < MAX_RSS_BYTES, (code, rss, err[-3000:])
    report = json.loads((tmp_path / "a" / "run" / "data_report.json").read_text())
    assert report["dropped"]["too_large"] == 3 and report["dropped"]["not_3d"] == 1, report["dropped"]

    # a Parquet index of 20 M dictionary-encoded rows, a few hundred KB on disk
    rows = pa.DictionaryArray.from_arrays(pa.array(np.zeros(20_000_000, np.int32)), pa.array(["img/0.png"]))
    pq.write_table(pa.table({"path": rows, "label": rows}), tmp_path / "huge.parquet")
    assert (tmp_path / "huge.parquet").stat().st_size < 2 << 20
    code, err, rss = run_child(["digits_cnn", *IMAGES, f"data.path={tmp_path / 'huge.parquet'}"], tmp_path / "b")
    assert code == 2 and "data.max_index_rows" in err and "Traceback" not in err and rss < MAX_RSS_BYTES, (rss, err)

    # an 8 MB UTF-16 annotation whose DOCTYPE would expand its filename to gigabytes
    voc = tmp_path / "voc"
    png(voc / "JPEGImages" / "a.png")
    (voc / "Annotations").mkdir()
    (voc / "Annotations" / "a.xml").write_bytes(bomb_xml() + "<!-- -->".encode("utf-16")[2:] * (1 << 19))
    code, err, rss = run_child(["coco_detection_finetune", "data.source=voc", f"data.path={voc}"], tmp_path / "c")
    assert code == 2 and "declares a DOCTYPE" in err and "Traceback" not in err and rss < MAX_RSS_BYTES, (rss, err)
    assert len(err) < 4000  # the line, not the expansion

    # a mask whose one value is 2e9 (a class count of 2e9 would be 15 GiB)
    masks = tmp_path / "masks"
    (masks / "masks").mkdir(parents=True)
    for i in range(4):
        png(masks / "images" / f"{i}.png", i)
        Image.fromarray(np.full((8, 8), 2_000_000_000 if i == 0 else 0, np.int32), mode="I").save(
            masks / "masks" / f"{i}.png", format="TIFF")
    code, err, rss = run_child(["segmentation_finetune", "data.source=masks", f"data.path={masks}",
                                "data.args={classes: [background, box], image_size: 8}"], tmp_path / "d")
    assert code == 2 and "values 2000000000" in err and "Traceback" not in err and rss < MAX_RSS_BYTES, (rss, err)
