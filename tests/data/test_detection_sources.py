"""The detection sources (issue 28): COCO JSON, YOLO txt and VOC XML of the same images give the same samples; every
cleaning reason is counted exactly; bad annotations are one line naming the file; augmentation moves the boxes with
the pixels; trainforge's mAP is pycocotools' own."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from trainforge.config import load_config
from trainforge.data import build_data
from trainforge.data.summary import summarize
from trainforge.errors import UserError

from vision_data import CLASSES, shapes_image, write_shapes

FORMATS = ("coco", "yolo", "voc")


def data_cfg(path: Path, source: str, *extra: str):
    return load_config("coco_detection_finetune", [f"data.source={source}", f"data.path={path}",
                                                   "data.args.image_size=64", *extra]).data


def samples(bundle) -> dict[str, list]:
    return {name: [getattr(bundle, name)[i] for i in range(len(getattr(bundle, name)))]
            for name in ("train", "val", "test")}


def test_the_three_formats_give_the_same_samples_with_the_boxes_written(tmp_path):
    truth = write_shapes(tmp_path, n=24, side=64, seed=3)
    built = {fmt: build_data(data_cfg(tmp_path / fmt, fmt), seed=0) for fmt in FORMATS}
    assert all(b.info.class_names == ("__background__", *CLASSES) for b in built.values())
    coco = samples(built["coco"])
    for fmt in ("yolo", "voc"):
        other = samples(built[fmt])
        assert built[fmt].report["splits"] == built["coco"].report["splits"]
        for split in coco:
            for (x, y), (x2, y2) in zip(coco[split], other[split], strict=True):
                assert torch.equal(x, x2) and torch.equal(y["labels"], y2["labels"])
                assert torch.allclose(y["boxes"], y2["boxes"], atol=1e-4), (fmt, y, y2)  # YOLO: fractions
    # and those are the boxes written (the images are already 64 x 64: nothing is scaled)
    by_file = {file: (boxes, names) for file, boxes, names in truth}
    bundle = built["coco"]
    ids = bundle.train.samples.ids
    for k, index in enumerate(bundle.train.indices):
        boxes, names = by_file[ids[index]]
        _, y = bundle.train[k]
        assert y["boxes"].tolist() == [list(map(float, b)) for b in boxes]
        assert y["labels"].tolist() == [CLASSES.index(n) + 1 for n in names]


def test_boxes_are_scaled_with_their_image(tmp_path):
    truth = write_shapes(tmp_path, n=6, side=64, seed=1, formats=("coco",))
    bundle = build_data(data_cfg(tmp_path / "coco", "coco", "data.args.image_size=32", "data.val_fraction=0",
                                 "data.test_fraction=0"), seed=0)
    by_file = {file: boxes for file, boxes, _ in truth}
    for k, index in enumerate(bundle.train.indices):
        x, y = bundle.train[k]
        assert x.shape == (3, 32, 32)
        want = torch.tensor(by_file[bundle.train.samples.ids[index]], dtype=torch.float32) / 2
        assert torch.equal(y["boxes"], want)


def planted(tmp_path: Path) -> Path:
    """A COCO set of 8 good images plus one of each defect, whose exact counts the test knows."""
    write_shapes(tmp_path, n=8, side=64, seed=5, formats=("coco",))
    root = tmp_path / "coco"
    doc = json.loads((root / "annotations.json").read_text())
    images = root / "images"
    (images / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    shutil.copy(images / "img_0000.png", images / "copy_of_0.png")
    for name, seed in (("negative.png", 100), ("edge.png", 101)):  # new pixels: not duplicates
        Image.fromarray(shapes_image(np.random.default_rng(seed), 64)[0]).save(images / name)
    extra = [("corrupt.png", [[10, 10, 5, 5, 1]]), ("missing.png", [[10, 10, 5, 5, 1]]),
             ("copy_of_0.png", [[10, 10, 5, 5, 1]]), ("negative.png", []),
             # edge.png: one box reaching 6 px past the right edge (clipped), one with no width, one of class 99,
             # one entirely left of the image (zero area once clipped), one fine
             ("edge.png", [[60, 10, 10, 10, 1], [20, 20, 0, 10, 2], [30, 30, 8, 8, 99], [-20, 5, 10, 10, 1],
                           [5, 40, 10, 10, 2]])]
    for file, boxes in extra:
        image_id = len(doc["images"])
        doc["images"].append({"id": image_id, "file_name": file, "width": 64, "height": 64})
        for x, y, w, h, c in boxes:
            doc["annotations"].append({"id": len(doc["annotations"]), "image_id": image_id, "category_id": c,
                                       "bbox": [x, y, w, h], "iscrowd": 0})
    (root / "annotations.json").write_text(json.dumps(doc))
    return root


def test_every_cleaning_reason_is_counted_exactly(tmp_path):
    root = planted(tmp_path)
    report = build_data(data_cfg(root, "coco", "data.args.unknown_categories=drop"), seed=0).report
    assert report["dropped"] == {"corrupt": 1, "missing_file": 1, "duplicate": 1, "no_annotations": 0,
                                 "out_of_bounds": 1, "zero_area": 2, "unknown_category": 1}
    assert report["dropped_examples"]["out_of_bounds"] == ["edge.png box 0"]
    assert report["dropped_examples"]["zero_area"] == ["edge.png box 1", "edge.png box 3"]
    assert report["dropped_examples"]["unknown_category"] == ["edge.png box 2"]
    assert report["negatives"] == 1 and report["rows_read"] == 13 and report["rows_kept"] == 10
    good = json.loads((root / "annotations.json").read_text())["annotations"]
    boxes = report["boxes"]
    assert boxes["read"] == len(good) and boxes["in_dropped_images"] == 3  # of the corrupt, missing, duplicate images
    assert boxes["kept"] == boxes["read"] - 3 - 3  # edge.png drops 3 of its 5 boxes
    line = summarize(report).line
    assert "13 images read, 10 kept, dropped 3 (corrupt 1, missing_file 1, duplicate 1)" in line
    assert "1 clipped to their image (out_of_bounds), dropped 3 (zero_area 2, unknown_category 1)" in line
    assert "1 images without boxes kept as negatives" in line
    # the clipped box is the part inside the image
    bundle = build_data(data_cfg(root, "coco", "data.args.unknown_categories=drop", "data.val_fraction=0",
                                 "data.test_fraction=0"), seed=0)
    edge = bundle.train.samples.ids.index("edge.png")
    _, y = bundle.train[int(np.flatnonzero(bundle.train.indices == edge)[0])]
    assert y["boxes"].tolist() == [[60.0, 10.0, 64.0, 20.0], [5.0, 40.0, 15.0, 50.0]]
    # images without boxes dropped instead of kept, on request
    dropped = build_data(data_cfg(root, "coco", "data.args.unknown_categories=drop",
                                  "data.args.empty_images=drop"), seed=0).report
    assert dropped["dropped"]["no_annotations"] == 1 and dropped["negatives"] == 0 and dropped["rows_kept"] == 9


def test_the_cleaning_is_printed_on_the_console(tmp_path):
    root = planted(tmp_path)
    out = subprocess.run([sys.executable, "-m", "trainforge", "train", "coco_detection_finetune", f"data.path={root}",
                          "data.args={image_size: 32, unknown_categories: drop}", "train.max_steps=1",
                          "train.micro_batch_size=2", "train.global_batch_size=2", "data.augment={}",
                          "model.args={arch: fasterrcnn_resnet50_fpn, backbone: resnet18, pretrained: false}",
                          "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    console = out.stdout + out.stderr
    assert ("data: 13 images read, 10 kept, dropped 3 (corrupt 1, missing_file 1, duplicate 1); boxes" in console
            and "dropped 3 (zero_area 2, unknown_category 1)" in console), console[-3000:]


def coco_doc(**changes) -> dict:
    doc = {"images": [{"id": 1, "file_name": "a.png"}],
           "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]}],
           "categories": [{"id": 1, "name": "box"}]}
    doc.update(changes)
    return doc


def write_coco_doc(root: Path, doc: dict) -> Path:
    (root / "images").mkdir(parents=True)
    write_shapes(root / "src", n=1, side=16, formats=("coco",))
    shutil.copy(root / "src" / "coco" / "images" / "img_0000.png", root / "images" / "a.png")
    (root / "annotations.json").write_text(json.dumps(doc))
    return root


def write_yolo_lines(root: Path, text: str) -> Path:
    write_shapes(root, n=1, side=16, formats=("yolo",))
    (root / "yolo" / "labels" / "img_0000.txt").write_text(text)
    return root / "yolo"


def write_voc_text(root: Path, text: str) -> Path:
    write_shapes(root, n=1, side=16, formats=("voc",))
    (root / "voc" / "Annotations" / "img_0000.xml").write_text(text)
    return root / "voc"


BAD = {
    "coco without images": ("coco", lambda r: write_coco_doc(r, {k: v for k, v in coco_doc().items() if k != "images"}),
                            r"annotations.json: no 'images' list; a COCO file is"),
    "coco box as strings": ("coco", lambda r: write_coco_doc(r, coco_doc(annotations=[
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": ["1", "2", "3", "4"]}])),
        r"annotations.json annotations\[0\]: each bbox value must be a finite number, got '1'; write \[x, y, width"),
    "coco unknown category": ("coco", lambda r: write_coco_doc(r, coco_doc(annotations=[
        {"id": 1, "image_id": 1, "category_id": 7, "bbox": [1, 2, 3, 4]}])),
        r"annotations.json annotations\[0\]: category 7 is not among the 1 categories of annotations.json; .*"
        r"unknown_categories: drop"),
    "coco image outside the folder": ("coco", lambda r: write_coco_doc(r, coco_doc(
        images=[{"id": 1, "file_name": "../../etc/passwd"}])), r"image '../../etc/passwd' is not a path inside"),
    "coco not json": ("coco", lambda r: (write_coco_doc(r, coco_doc()), (r / "annotations.json").write_text("{,"))[0],
                      r"annotations.json: not valid JSON \(line 1, column 2"),
    "yolo line of 4 numbers": ("yolo", lambda r: write_yolo_lines(r, "0 0.5 0.5 0.2\n"),
                               r"img_0000.txt line 1: 4 values; a YOLO line is `class cx cy w h`"),
    "yolo class beyond names": ("yolo", lambda r: write_yolo_lines(r, "5 0.5 0.5 0.2 0.2\n"),
                                r"img_0000.txt line 1: category 5 is not among the 2 names of data.yaml"),
    "voc entity": ("voc", lambda r: write_voc_text(r, '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "y">]>'
                                                      "<annotation><filename>img_0000.png</filename></annotation>"),
                   r"img_0000.xml: declares a DOCTYPE or entities"),
    "voc box not a number": ("voc", lambda r: write_voc_text(r, "<annotation><filename>img_0000.png</filename><object>"
                                                                "<name>box</name><bndbox><xmin>a</xmin><ymin>1</ymin>"
                                                                "<xmax>3</xmax><ymax>4</ymax></bndbox></object>"
                                                                "</annotation>"),
                             r"img_0000.xml object 0: <xmin> is 'a', not a number"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_annotations_are_one_line_naming_the_file(tmp_path, case):
    source, make, message = BAD[case]
    root = make(tmp_path / "data")
    with pytest.raises(UserError, match=message):
        build_data(data_cfg(root, source), seed=0)


@pytest.mark.parametrize("case", ["coco box as strings", "yolo line of 4 numbers", "voc entity"])
def test_bad_annotations_exit_2_with_one_line_and_touch_nothing(tmp_path, case):
    source, make, message = BAD[case]
    root = make(tmp_path / "data")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    out = subprocess.run([sys.executable, "-m", "trainforge", "train", "coco_detection_finetune",
                          f"data.source={source}", f"data.path={root}", "--run-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert __import__("re").search(message, lines[0]), lines[0]
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_yolo_reads_polygon_lines_and_class_name_mappings(tmp_path):
    root = write_yolo_lines(tmp_path, "1 0.25 0.25 0.75 0.25 0.5 0.75\n")
    (root / "data.yaml").write_text(yaml.safe_dump({"names": {0: "box", 1: "disc"}}))
    bundle = build_data(data_cfg(root, "yolo", "data.args.image_size=16", "data.val_fraction=0",
                                 "data.test_fraction=0"), seed=0)
    _, y = bundle.train[0]
    assert y["boxes"].tolist() == [[4.0, 4.0, 12.0, 12.0]] and y["labels"].tolist() == [2]


def test_augmentation_moves_the_boxes_with_the_pixels(tmp_path):
    write_shapes(tmp_path, n=12, side=64, seed=2, formats=("coco",))
    plain = build_data(data_cfg(tmp_path / "coco", "coco", "data.augment={}"), seed=0)
    flipped = build_data(data_cfg(tmp_path / "coco", "coco", "data.augment={hflip: 1.0}"), seed=0)
    for index in range(len(plain.train)):
        x, y = plain.train[index]
        fx, fy = flipped.train[(0, index)]
        assert torch.equal(fx, x.flip(-1))
        mirrored = torch.stack([64 - y["boxes"][:, 2], y["boxes"][:, 1], 64 - y["boxes"][:, 0], y["boxes"][:, 3]], 1)
        assert torch.equal(fy["boxes"], mirrored) and torch.equal(fy["labels"], y["labels"])
    # a crop moves and clips boxes, drops those it leaves out, and draws the same from the same (seed, epoch, index)
    cropped = build_data(data_cfg(tmp_path / "coco", "coco", "data.augment={crop_scale: [0.2, 0.4]}"), seed=0)
    lost = 0
    for index in range(len(plain.train)):
        x, y = cropped.train[(1, index)]
        x2, y2 = cropped.train[(1, index)]
        assert torch.equal(x, x2) and torch.equal(y["boxes"], y2["boxes"])
        assert ((y["boxes"] >= 0) & (y["boxes"] <= 64)).all()
        assert len(y["boxes"]) == len(y["labels"])
        lost += len(plain.train[index][1]["labels"]) - len(y["labels"])
    assert lost > 0  # crops of a fifth to two fifths of the image leave some shapes out


def test_map_is_pycocotools_own_on_the_same_detections():
    """coco_metrics (torchmetrics on the pycocotools backend) against COCOeval run directly on the same lists."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from trainforge.tasks.detection import coco_metrics

    g = torch.Generator().manual_seed(0)
    targets, predictions = [], []
    for _ in range(30):
        n = int(torch.randint(1, 5, (), generator=g))
        xy = torch.rand(n, 2, generator=g) * 200
        wh = 8 + torch.rand(n, 2, generator=g) * 120  # small, medium and large objects
        boxes = torch.cat([xy, xy + wh], 1)
        labels = torch.randint(1, 4, (n,), generator=g)
        targets.append({"boxes": boxes, "labels": labels})
        keep = torch.rand(n, generator=g) > 0.2
        noisy = boxes[keep] + torch.randn(int(keep.sum()), 4, generator=g) * 6
        extra = torch.rand(2, 2, generator=g) * 200
        predictions.append({"boxes": torch.cat([noisy, torch.cat([extra, extra + 30], 1)]),
                            "scores": torch.rand(int(keep.sum()) + 2, generator=g),
                            "labels": torch.cat([labels[keep], torch.randint(1, 4, (2,), generator=g)])})
    ours = coco_metrics(predictions, targets, ("__background__", "a", "b", "c"), per_class=True)

    gt = {"images": [], "annotations": [], "categories": [{"id": c} for c in (1, 2, 3)]}
    found = []
    for i, (t, p) in enumerate(zip(targets, predictions)):
        gt["images"].append({"id": i})
        for b, c in zip(t["boxes"].tolist(), t["labels"].tolist()):
            w, h = b[2] - b[0], b[3] - b[1]
            gt["annotations"].append({"id": len(gt["annotations"]) + 1, "image_id": i, "category_id": c,
                                      "bbox": [b[0], b[1], w, h], "area": w * h, "iscrowd": 0})
        for b, s, c in zip(p["boxes"].tolist(), p["scores"].tolist(), p["labels"].tolist()):
            found.append({"image_id": i, "category_id": c, "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                          "score": s})
    coco = COCO()
    coco.dataset = gt
    coco.createIndex()
    evaluation = COCOeval(coco, coco.loadRes(found), "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    stats = evaluation.stats  # AP, AP50, AP75, APs, APm, APl, AR1, AR10, AR100, ARs, ARm, ARl
    direct = dict(zip(("map", "map_50", "map_75", "map_small", "map_medium", "map_large", "mar_1", "mar_10",
                       "mar_100"), stats[:9]))
    for name, value in direct.items():
        assert ours[name] == pytest.approx(value, abs=1e-4), name
    assert 0.2 < ours["map_50"] < 0.95  # neither trivial nor perfect: the comparison means something
    precision = evaluation.eval["precision"][:, :, :, 0, 2]  # IoU, recall, class, area all, 100 detections
    for k, name in enumerate(("a", "b", "c")):
        p = precision[:, :, k]
        assert ours["per_class"][name]["ap"] == pytest.approx(float(p[p > -1].mean()), abs=1e-4)
        # the report's precision-recall curve: COCO's interpolated precision at IoU 0.5 at each recall level
        curve = ours["pr_curves"]["precision"][name]
        want = [None if v < 0 else v for v in p[0].tolist()]
        assert [c is None for c in curve] == [w is None for w in want]
        assert [c for c in curve if c is not None] == pytest.approx([w for w in want if w is not None], abs=1e-4)
    assert ours["pr_curves"]["recall"] == pytest.approx(evaluation.params.recThrs.tolist())
