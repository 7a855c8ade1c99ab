"""`voc`: a Pascal VOC detection data set: data.path holds `Annotations/*.xml` (one per image: its `filename`, and an
`object` per box with its `name` and `bndbox` xmin ymin xmax ymax in pixels) and `JPEGImages/`. Classes are
data.args.classes when given (a box of another name is an unknown category), else every name the files use, sorted.
Objects marked `difficult` are kept (VOC's evaluation ignores them; torchvision's reference trains on them). An XML
file with a DOCTYPE (entities: the way to make a small file expand into gigabytes) is refused before anything is
expanded, in whatever encoding it is written (expat reads the declaration and stops there); VOC's files never have
one. Any other failure to read one file is one line naming it. Boxes are cleaned as data/sources/boxes.py says.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from xml.parsers import expat
from typing import Optional

from trainforge.config import DataConfig
from trainforge.data.pool import Pool
from trainforge.data.sources.boxes import Annotated, BoxArgs, box_pool, unknown_category
from trainforge.data.sources.common import SOURCES, class_names_for, parse_args, require_path
from trainforge.errors import UserError, quote
from trainforge.files import read_regular

WHAT = "a Pascal VOC folder: Annotations/*.xml and JPEGImages/"
MAX_XML_BYTES = 16 * 2**20  # one image's annotation is a few kilobytes


class VocArgs(BoxArgs):
    classes: Optional[list[str]] = None  # the class names in index order; default: every name used, sorted


@SOURCES.register("voc")
def voc(cfg: DataConfig, *, seed: int) -> Pool:
    """data.path: Annotations/ + JPEGImages/; args image_size (320), classes, empty_images, unknown_categories."""
    a = parse_args(VocArgs, cfg)
    root = require_path(cfg, WHAT)
    for part in ("Annotations", "JPEGImages"):
        if not (root / part).is_dir():
            raise UserError(f"data.path: {root} has no {part}/ folder; point it at {WHAT}", public=True)
    parsed = [read_xml(f) for f in sorted((root / "Annotations").glob("*.xml")) if f.is_file()]
    if not parsed:
        raise UserError(f"data.path: {root}/Annotations has no .xml files; point data.path at {WHAT}", public=True)
    used = sorted({name for _, objects in parsed for name, _, _ in objects})
    names = class_names_for(used, a.classes)
    index = {n: k + 1 for k, n in enumerate(names)}
    declared = "data.args.classes" if a.classes else "the names used"
    images = []
    for (image, objects) in parsed:
        for name, box, where in objects:
            label = index.get(name)
            image.boxes.append(box)
            image.labels.append(label if label is not None else unknown_category(where, name, declared, a))
        images.append(image)
    return box_pool(cfg, a, root / "JPEGImages", images, names)


class _Declares(Exception):
    pass


def _refuse_declarations(data: bytes) -> None:
    """Raise _Declares at a DOCTYPE or an entity declaration, before expat expands anything; expat decodes the file
    (UTF-8, UTF-16 with its BOM, an encoding in the XML declaration) as the real parse would, so no encoding hides one."""
    parser = expat.ParserCreate()

    def refuse(*_: object) -> None:
        raise _Declares()

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.Parse(data, True)


def read_xml(file: Path) -> tuple[Annotated, list[tuple[str, tuple[float, float, float, float], str]]]:
    """(the image with no boxes yet, [(class name, box, where)]) of one annotation file; one UserError naming the file
    for anything wrong with it."""
    try:
        return _read_xml(file)
    except UserError:
        raise
    except Exception as e:  # per file, whatever the failure: one line naming it
        raise UserError(f"{file}: cannot be read as a VOC annotation ({type(e).__name__}); a VOC file is "
                        "<annotation><filename>...", public=True) from None


def _read_xml(file: Path) -> tuple[Annotated, list[tuple[str, tuple[float, float, float, float], str]]]:
    data, _, size = read_regular(file, MAX_XML_BYTES + 1, follow_links=True)
    if size > MAX_XML_BYTES:
        raise UserError(f"{file}: {size:,} bytes, more than {MAX_XML_BYTES:,} for one image's "
                        "annotation; is it a VOC file?", public=True)
    try:
        _refuse_declarations(data)
        root = ET.fromstring(data)
    except _Declares:
        raise UserError(f"{file}: declares a DOCTYPE or entities, which VOC annotations never do; remove them",
                        public=True) from None
    except (ET.ParseError, expat.ExpatError) as e:
        raise UserError(f"{file}: not well-formed XML ({e}); a VOC file is <annotation><filename>...", public=True) \
            from None
    filename = (root.findtext("filename") or "").strip()
    if not filename:
        raise UserError(f"{file}: no <filename>; name the image in JPEGImages/ this file annotates", public=True)
    objects = []
    for k, obj in enumerate(root.iter("object")):
        where = f"{file} object {k}"
        name = (obj.findtext("name") or "").strip()
        box = obj.find("bndbox")
        if not name or box is None:
            raise UserError(f"{where}: needs a <name> and a <bndbox>", public=True)
        values = []
        for tag in ("xmin", "ymin", "xmax", "ymax"):
            text = (box.findtext(tag) or "").strip()
            try:
                values.append(float(text))
            except ValueError:
                raise UserError(f"{where}: <{tag}> is {quote(text)}, not a number; write the box in pixels", public=True) \
                    from None
            if values[-1] != values[-1] or abs(values[-1]) == float("inf"):
                raise UserError(f"{where}: <{tag}> is {quote(text)}, not a finite number; write the box in pixels",
                                public=True)
        objects.append((name, tuple(values), where))
    return Annotated(filename, str(file)), objects
