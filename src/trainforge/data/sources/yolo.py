"""`yolo`: a YOLO detection data set: data.path holds `data.yaml` (class names: `names: [a, b]` or `{0: a, 1: b}`),
`images/` and `labels/`, where `labels/<same subpath>.txt` holds one line per box of `images/<subpath>.<ext>`:
`class cx cy w h`, the centre and size in fractions of the image's width and height. A line of a polygon
(`class x1 y1 x2 y2 ...`, YOLO's segment format) gives the box around it. An image without a label file, or with an
empty one, has no boxes. Any other line is one line naming the file, the line and the fix. Boxes are cleaned as
data/sources/boxes.py says.
"""
from __future__ import annotations

from pathlib import Path

from trainforge.config import DataConfig, read_yaml
from trainforge.data.formats.manifest import IMAGE_SUFFIXES
from trainforge.data.pool import Pool
from trainforge.data.sources.boxes import Annotated, BoxArgs, box_pool, unknown_category
from trainforge.data.sources.common import SOURCES, parse_args, require_path
from trainforge.errors import UserError, quote

WHAT = "a YOLO folder: data.yaml, images/ and labels/"
LINE = "a YOLO line is `class cx cy w h`: a class index and four fractions of the image's size"
MAX_LABEL_BYTES = 16 * 2**20  # a label file larger than this is not one image's boxes


@SOURCES.register("yolo")
def yolo(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: data.yaml + images/ + labels/; args image_size (320), empty_images, unknown_categories."""
    a = parse_args(BoxArgs, cfg)
    root = require_path(cfg, WHAT)
    for part in ("data.yaml", "images"):
        if not (root / part).exists():
            raise UserError(f"data.path: {root} has no {part}; point it at {WHAT}", public=True)
    names = class_names(root / "data.yaml")
    images = []
    for path in sorted(p for p in (root / "images").rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
                       and p.is_file() and not any(s.startswith(".") for s in p.relative_to(root).parts)):
        rel = path.relative_to(root / "images")
        label_file = (root / "labels" / rel).with_suffix(".txt")
        images.append(read_labels(label_file, rel.as_posix(), names, a))
    return box_pool(cfg, a, root / "images", images, names)


def class_names(file: Path) -> list[str]:
    try:  # the hardened reader: bounded size, nesting and aliases; a FIFO or device refused, never waited on
        doc = read_yaml(file, "write `names: [class0, class1, ...]`", allow_empty=True)
    except UserError as e:
        raise UserError(str(e), public=True) from None
    names = doc.get("names") if isinstance(doc, dict) else None
    if isinstance(names, dict) and all(isinstance(k, int) for k in names) and sorted(names) == list(range(len(names))):
        names = [names[k] for k in range(len(names))]
    if not isinstance(names, list) or not names or not all(isinstance(n, (str, int)) for n in names):
        raise UserError(f"{file}: needs `names`: the class names in index order, a list or {{0: name, ...}}",
                        public=True)
    names = [str(n) for n in names]
    if len(set(names)) != len(names):
        raise UserError(f"{file}: `names` repeats a class; list each class once", public=True)
    return names


def read_labels(file: Path, image: str, names: list[str], args: BoxArgs) -> Annotated:
    """The boxes of one image from its label file (none when it has no file)."""
    a = Annotated(image, str(file), normalized=True)
    if not file.is_file():
        return a
    if file.stat().st_size > MAX_LABEL_BYTES:
        raise UserError(f"{file}: {file.stat().st_size:,} bytes, more than {MAX_LABEL_BYTES:,} for one image's "
                        "boxes; is it a label file?", public=True)
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{file}: cannot be read as text ({type(e).__name__}); {LINE}", public=True) from None
    for n, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        where = f"{file} line {n}"
        values = [_value(v, where) for v in fields]
        if len(values) < 5 or (len(values) > 5 and len(values) % 2 == 0):
            raise UserError(f"{where}: {len(values)} values; {LINE} (5 values), or a class and x y pairs of a "
                            "polygon", public=True)
        cls = values[0]
        if not cls.is_integer() or cls < 0:
            raise UserError(f"{where}: class {quote(fields[0])} is not a class index (0, 1, ...); {LINE}", public=True)
        if len(values) == 5:
            cx, cy, w, h = values[1:]
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
        else:
            xs, ys = values[1::2], values[2::2]
            box = (min(xs), min(ys), max(xs), max(ys))
        k = int(cls)
        a.boxes.append(box)
        a.labels.append(k + 1 if k < len(names) else unknown_category(where, k, f"the {len(names)} names of "
                                                                                 "data.yaml", args))
    return a


def _value(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{where}: {quote(text)} is not a number; {LINE}", public=True) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise UserError(f"{where}: {quote(text)} is not a finite number; {LINE}", public=True)
    return value
