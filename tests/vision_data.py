"""Generated detection data sets whose boxes are known exactly (issue 28): red rectangles ("box") and blue ellipses
("disc") on noise, each image written once as PNG and annotated three ways, as COCO JSON, YOLO txt and VOC XML,
with the same integer pixel boxes; and the same kind of images with the label maps of their pixels (`write_masks`).

    truth = write_shapes(tmp_path, n=64, side=64, seed=0)     # tmp_path/coco, tmp_path/yolo, tmp_path/voc
    truth[i] == ("img_0003.png", [(x1, y1, x2, y2), ...], ["box", "disc", ...])
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import yaml
from PIL import Image

CLASSES = ("box", "disc")
COLOURS = {"box": (230, 40, 40), "disc": (40, 40, 230)}

Truth = tuple[str, list[tuple[int, int, int, int]], list[str]]


def shapes_image(rng: np.random.Generator, side: int, max_objects: int = 3, width: Optional[int] = None,
                 sizes: tuple[int, int] = (6, 3)) -> tuple[np.ndarray, list, list]:
    """One (side, width or side, 3) uint8 image and its boxes and class names: 1..max_objects shapes that do not
    overlap, each side // sizes[0] to side // sizes[1] pixels a side."""
    image, boxes, names, _ = shapes_and_mask(rng, side, max_objects, width, sizes)
    return image, boxes, names


def shapes_and_mask(rng: np.random.Generator, side: int, max_objects: int = 3, width: Optional[int] = None,
                    sizes: tuple[int, int] = (6, 3)) -> tuple[np.ndarray, list, list, np.ndarray]:
    """shapes_image's, and the (side, width) uint8 mask of its pixels' classes (0 background, 1 box, 2 disc)."""
    across = width or side
    image = rng.integers(0, 80, (side, across, 3), dtype=np.uint8)
    mask = np.zeros((side, across), dtype=np.uint8)
    boxes: list[tuple[int, int, int, int]] = []
    names: list[str] = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            w, h = (int(v) for v in rng.integers(side // sizes[0], side // sizes[1], 2))
            x, y = int(rng.integers(0, across - w)), int(rng.integers(0, side - h))
            if all(x >= b[2] + 1 or x + w + 1 <= b[0] or y >= b[3] + 1 or y + h + 1 <= b[1] for b in boxes):
                break
        else:
            continue
        name = CLASSES[int(rng.integers(0, 2))]
        if name == "box":
            image[y:y + h, x:x + w] = COLOURS[name]
            mask[y:y + h, x:x + w] = 1
        else:
            yy, xx = np.mgrid[0:h, 0:w]
            inside = ((yy + 0.5 - h / 2) / (h / 2)) ** 2 + ((xx + 0.5 - w / 2) / (w / 2)) ** 2 <= 1
            image[y:y + h, x:x + w][inside] = COLOURS[name]
            mask[y:y + h, x:x + w][inside] = 2
        boxes.append((x, y, x + w, y + h))
        names.append(name)
    return image, boxes, names, mask


def write_shapes(root: Path, n: int = 64, side: int = 64, seed: int = 0,
                 formats: tuple[str, ...] = ("coco", "yolo", "voc"), width: Optional[int] = None,
                 sizes: tuple[int, int] = (6, 3)) -> list[Truth]:
    """Write `n` images (`side` high, `width` wide: square without) to root/<format> for each format; returns each
    image's file, boxes and class names."""
    rng = np.random.default_rng(seed)
    truth: list[Truth] = []
    images = []
    for i in range(n):
        image, boxes, names = shapes_image(rng, side, width=width, sizes=sizes)
        truth.append((f"img_{i:04d}.png", boxes, names))
        images.append(image)
    for fmt in formats:
        WRITERS[fmt](root / fmt, images, truth)
    return truth


def write_coco(folder: Path, images: list[np.ndarray], truth: list[Truth], extra: Optional[dict] = None) -> None:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    doc: dict = {"images": [], "annotations": [],
                 "categories": [{"id": k + 1, "name": name} for k, name in enumerate(CLASSES)]}
    for i, (image, (file, boxes, names)) in enumerate(zip(images, truth)):
        Image.fromarray(image).save(folder / "images" / file)
        doc["images"].append({"id": i, "file_name": file, "width": image.shape[1], "height": image.shape[0]})
        for (x1, y1, x2, y2), name in zip(boxes, names):
            doc["annotations"].append({"id": len(doc["annotations"]), "image_id": i, "iscrowd": 0,
                                       "category_id": CLASSES.index(name) + 1, "area": (x2 - x1) * (y2 - y1),
                                       "bbox": [x1, y1, x2 - x1, y2 - y1]})
    doc.update(extra or {})
    (folder / "annotations.json").write_text(json.dumps(doc))


def write_yolo(folder: Path, images: list[np.ndarray], truth: list[Truth]) -> None:
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "labels").mkdir(parents=True, exist_ok=True)
    (folder / "data.yaml").write_text(yaml.safe_dump({"names": list(CLASSES)}))
    for image, (file, boxes, names) in zip(images, truth):
        Image.fromarray(image).save(folder / "images" / file)
        h, w = image.shape[:2]
        lines = [f"{CLASSES.index(name)} {(x1 + x2) / 2 / w!r} {(y1 + y2) / 2 / h!r} {(x2 - x1) / w!r} {(y2 - y1) / h!r}"
                 for (x1, y1, x2, y2), name in zip(boxes, names)]
        (folder / "labels" / file).with_suffix(".txt").write_text("\n".join(lines) + "\n")


def write_voc(folder: Path, images: list[np.ndarray], truth: list[Truth]) -> None:
    (folder / "JPEGImages").mkdir(parents=True, exist_ok=True)
    (folder / "Annotations").mkdir(parents=True, exist_ok=True)
    for image, (file, boxes, names) in zip(images, truth):
        Image.fromarray(image).save(folder / "JPEGImages" / file)
        h, w = image.shape[:2]
        objects = "".join(f"<object><name>{name}</name><difficult>0</difficult><bndbox><xmin>{x1}</xmin>"
                          f"<ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
                          for (x1, y1, x2, y2), name in zip(boxes, names))
        (folder / "Annotations" / file).with_suffix(".xml").write_text(
            f"<annotation><filename>{file}</filename><size><width>{w}</width><height>{h}</height><depth>3</depth>"
            f"</size>{objects}</annotation>")


WRITERS = {"coco": write_coco, "yolo": write_yolo, "voc": write_voc}
MASK_CLASSES = ("background", *CLASSES)


def write_masks(root: Path, n: int = 64, side: int = 64, seed: int = 0, palette: bool = False,
                width: Optional[int] = None) -> list[np.ndarray]:
    """`n` images in root/images and their label maps in root/masks (the `masks` source): 0 background, 1 box,
    2 disc (a palette PNG with `palette`, as VOC's, else grey). Returns the masks."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    masks = []
    for i in range(n):
        image, _, _, mask = shapes_and_mask(rng, side, width=width)
        Image.fromarray(image).save(root / "images" / f"img_{i:04d}.jpg", quality=95)
        picture = Image.fromarray(mask, mode="L")
        if palette:
            picture = picture.convert("P")
            picture.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0] + [0] * (256 * 3 - 9))
        picture.save(root / "masks" / f"img_{i:04d}.png")
        masks.append(mask)
    return masks
