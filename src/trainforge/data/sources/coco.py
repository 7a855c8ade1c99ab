"""`coco`: a COCO detection data set: data.path holds `annotations.json` (or a single `*.json`) beside `images/`.

The file's `images` (id, file_name), `annotations` (image_id, category_id, bbox [x, y, width, height] in pixels,
iscrowd) and `categories` (id, name) are read; classes are the categories in id order. Crowd annotations
(iscrowd 1: one box around a group, which COCO's own evaluation ignores) are not trained on and are counted in the
data report (`crowd_boxes`). A file that is not such a document is one line naming it, the entry and the fix.
Boxes are cleaned as data/sources/boxes.py says.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from trainforge.config import DataConfig
from trainforge.data.pool import Pool
from trainforge.data.sources.boxes import (UNKNOWN, Annotated, BoxArgs, box_pool, check_name, number,
                                           unknown_category)
from trainforge.data.sources.common import SOURCES, parse_args, require_path
from trainforge.errors import UserError, quote

WHAT = "a folder with a COCO annotations.json and its images/ folder"
FIX = "a COCO file is {\"images\": [...], \"annotations\": [...], \"categories\": [...]}"


class CocoArgs(BoxArgs):
    annotations: Optional[str] = None  # the JSON file's name in data.path (default annotations.json, or the one *.json)


@SOURCES.register("coco")
def coco(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: annotations.json + images/; args image_size (320), empty_images, unknown_categories, annotations."""
    a = parse_args(CocoArgs, cfg)
    root = require_path(cfg, WHAT)
    file = annotation_file(root, a.annotations)
    doc = read_json(file)
    images, class_names, crowd = parse_coco(doc, file.name, a)
    return box_pool(cfg, a, root / "images", images, class_names,
                    notes={"annotations_file": file.name, "crowd_boxes": crowd})


def annotation_file(root: Path, name: Optional[str]) -> Path:
    if not root.is_dir():
        raise UserError(f"data.path: {root} is a file; point it at {WHAT}", public=True)
    if name is not None:
        file = root / name
        if Path(name).name != name or not file.is_file():
            raise UserError(f"data.args.annotations: {name!r} is not a file in {root}; name the JSON file there",
                            public=True)
        return file
    if (root / "annotations.json").is_file():
        return root / "annotations.json"
    found = sorted(p for p in root.glob("*.json") if p.is_file())
    if len(found) != 1:
        listed = ", ".join(p.name for p in found[:5]) or "none"
        raise UserError(f"data.path: {root} has {len(found)} *.json files ({listed}) and no annotations.json; name "
                        "the COCO file in data.args.annotations", public=True)
    return found[0]


def read_json(file: Path) -> Any:
    try:
        with open(file, "rb") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise UserError(f"{file}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); {FIX}",
                        public=True) from None
    except RecursionError:
        raise UserError(f"{file}: nested too deeply to be a COCO file; {FIX}", public=True) from None
    except ValueError as e:  # an integer beyond Python's digit limit (json raises it outside JSONDecodeError)
        raise UserError(f"{file}: not a COCO file ({str(e)[:120]}); {FIX}", public=True) from None
    except Exception as e:  # whatever else fails in reading one file: one line naming it
        raise UserError(f"{file}: cannot be read ({type(e).__name__}); {FIX}", public=True) from None


def _list(doc: dict, key: str, file: str) -> list:
    value = doc.get(key)
    if not isinstance(value, list):
        why = "no" if key not in doc else f"a {type(value).__name__} for its"
        raise UserError(f"{file}: {why} {key!r} list; {FIX}", public=True)
    return value


def _entry(value: Any, key: str, file: str, i: int, fields: tuple[str, ...]) -> dict:
    if not isinstance(value, dict) or any(f not in value for f in fields):
        raise UserError(f"{file}: {key}[{i}] is not an object with {', '.join(fields)}; {FIX}", public=True)
    return value


def parse_coco(doc: Any, file: str, args: BoxArgs) -> tuple[list[Annotated], list[str], int]:
    """(one Annotated per image in the file's order, class names in category-id order, crowd boxes skipped)."""
    if not isinstance(doc, dict):
        raise UserError(f"{file}: a JSON {type(doc).__name__}, not an object; {FIX}", public=True)
    images, annotations, categories = (_list(doc, k, file) for k in ("images", "annotations", "categories"))
    cats = [_entry(c, "categories", file, i, ("id", "name")) for i, c in enumerate(categories)]
    for i, c in enumerate(cats):
        if isinstance(c["id"], bool) or not isinstance(c["id"], (int, str)):
            raise UserError(f"{file}: categories[{i}].id is {quote(c['id'])}, not a number or a name; {FIX}",
                            public=True)
    ids = [c["id"] for c in cats]
    if len(set(map(repr, ids))) != len(ids):
        raise UserError(f"{file}: categories repeat an id; give each category its own id", public=True)
    cats.sort(key=lambda c: (str(type(c["id"])), c["id"]))
    index = {repr(c["id"]): k + 1 for k, c in enumerate(cats)}
    names = [str(c["name"]) for c in cats]
    if len(set(names)) != len(names):
        raise UserError(f"{file}: categories repeat a name; give each category its own name", public=True)
    if not names:
        raise UserError(f"{file}: no categories; list the classes the boxes are of in \"categories\"", public=True)
    declared = f"the {len(names)} categories of {file}"
    by_id: dict[str, Annotated] = {}
    order = []
    for i, image in enumerate(images):
        image = _entry(image, "images", file, i, ("id", "file_name"))
        if not isinstance(image["file_name"], str):
            raise UserError(f"{file}: images[{i}].file_name is not a string; {FIX}", public=True)
        check_name(image["file_name"], f"{file}: images[{i}].file_name")
        key = repr(image["id"])
        if key in by_id:
            raise UserError(f"{file}: images[{i}] repeats image id {quote(image['id'])}; give each image its own id",
                            public=True)
        by_id[key] = Annotated(image["file_name"], f"{file} image {quote(image['id'])}")
        order.append(by_id[key])
    crowd = 0
    for i, ann in enumerate(annotations):
        ann = _entry(ann, "annotations", file, i, ("image_id", "category_id", "bbox"))
        where = f"{file} annotations[{i}]"
        target = by_id.get(repr(ann["image_id"]))
        if target is None:
            raise UserError(f"{where}: image_id {quote(ann['image_id'])} is not in \"images\"; fix the id or add the "
                            "image", public=True)
        bbox = ann["bbox"]
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise UserError(f"{where}: bbox must be [x, y, width, height] (4 numbers, pixels), got {quote(bbox)}",
                            public=True)
        x, y, w, h = (number(v, where, "each bbox value", "write [x, y, width, height] as numbers, in pixels")
                      for v in bbox)
        if ann.get("iscrowd") in (1, True):
            crowd += 1
            continue
        label = index.get(repr(ann["category_id"]))
        target.boxes.append((x, y, x + w, y + h))
        target.labels.append(label if label is not None else unknown_category(where, ann["category_id"], declared,
                                                                               args))
    assert UNKNOWN not in index.values()
    return order, names, crowd
