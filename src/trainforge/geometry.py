"""How an image file becomes a model's input, and how a model's answer goes back to the file's pixels (numpy only:
training, evaluation and `trainforge predict` use the same arithmetic).

    fit = fit_image(width=1242, height=375, size=640, mode="keep_aspect")   # Fit(scale 0.515.., 640 x 193)
    x, fit = read_fitted("frame.png", size=640, mode="letterbox")           # float32 (3, H, W) in [0, 1]
    boxes_in_model = to_model(boxes_in_file, fit);  to_file(boxes_in_model, fit) == boxes_in_file

`data.args.resize` (detection and segmentation; `data/sources/boxes.py`, `data/sources/masks.py`, and predict):
- keep_aspect (the default): scaled so the longer side is `size`, the aspect kept; the input is that size (a
  detector batches images of several sizes itself; a segmenter's batch is padded to size x size, bottom and right);
- letterbox: scaled the same way, then centred on a size x size canvas of gray (114/255, Ultralytics' fill);
- stretch: each side scaled to `size` on its own (a wide frame is squeezed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Union

import numpy as np

RESIZES = ("keep_aspect", "letterbox", "stretch")
LETTERBOX_FILL = 114 / 255  # the gray Ultralytics pads with


@dataclass(frozen=True)
class Fit:
    """File pixels -> model pixels: x_model = x_file * scale_x + left, y_model = y_file * scale_y + top. The resized
    image is `width` x `height`; the input tensor is `canvas_width` x `canvas_height` (larger only for letterbox)."""

    file_width: int
    file_height: int
    scale_x: float
    scale_y: float
    width: int
    height: int
    left: int = 0
    top: int = 0
    canvas_width: int = 0
    canvas_height: int = 0

    def to_json(self) -> dict[str, float]:
        return {"file_width": self.file_width, "file_height": self.file_height, "scale_x": self.scale_x,
                "scale_y": self.scale_y, "width": self.width, "height": self.height, "left": self.left,
                "top": self.top, "canvas_width": self.canvas_width, "canvas_height": self.canvas_height}

    @classmethod
    def from_json(cls, d: dict[str, float]) -> "Fit":
        return cls(int(d["file_width"]), int(d["file_height"]), float(d["scale_x"]), float(d["scale_y"]),
                   int(d["width"]), int(d["height"]), int(d.get("left", 0)), int(d.get("top", 0)),
                   int(d.get("canvas_width", 0)), int(d.get("canvas_height", 0)))


def fit_image(width: int, height: int, size: int, mode: str, pad: bool = False) -> Fit:
    """Where a `width` x `height` image lands in the model's input under `mode` (RESIZES) with side `size`; `pad`
    (keep_aspect): on a size x size canvas, top left (a segmenter's batch is one size; its mask pads with no class)."""
    if mode == "stretch":
        return Fit(width, height, size / width, size / height, size, size, canvas_width=size, canvas_height=size)
    scale = size / max(width, height)
    w, h = max(1, round(width * scale)), max(1, round(height * scale))
    if mode == "keep_aspect":
        side = (size, size) if pad else (w, h)
        return Fit(width, height, w / width, h / height, w, h, canvas_width=side[0], canvas_height=side[1])
    if mode == "letterbox":
        return Fit(width, height, w / width, h / height, w, h, (size - w) // 2, (size - h) // 2, size, size)
    raise ValueError(f"unknown resize {mode!r}; choose one of {', '.join(RESIZES)}")


def to_model(boxes: np.ndarray, fit: Fit) -> np.ndarray:
    """(n, 4) x1 y1 x2 y2 in the file's pixels -> in the model input's (float32)."""
    scale = np.asarray([fit.scale_x, fit.scale_y] * 2, dtype=np.float64)
    offset = np.asarray([fit.left, fit.top] * 2, dtype=np.float64)
    return (np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * scale + offset).astype(np.float32)


def to_file(boxes: np.ndarray, fit: Fit) -> np.ndarray:
    """(n, 4) boxes in the model input's pixels -> in the file's, clipped to the file (float32)."""
    scale = np.asarray([fit.scale_x, fit.scale_y] * 2, dtype=np.float64)
    offset = np.asarray([fit.left, fit.top] * 2, dtype=np.float64)
    out = (np.asarray(boxes, dtype=np.float64).reshape(-1, 4) - offset) / scale
    limits = np.asarray([fit.file_width, fit.file_height] * 2, dtype=np.float64)
    return np.clip(out, 0.0, limits).astype(np.float32)


def fit_mask(mask: np.ndarray, fit: Fit, fill: int) -> np.ndarray:
    """A (H, W) class mask of the file -> the model input's canvas (nearest neighbour; `fill` where no image is)."""
    from PIL import Image

    resized = np.asarray(Image.fromarray(mask).resize((fit.width, fit.height), Image.Resampling.NEAREST))
    if (fit.canvas_width, fit.canvas_height) == (fit.width, fit.height):
        return resized
    canvas = np.full((fit.canvas_height, fit.canvas_width), fill, dtype=resized.dtype)
    canvas[fit.top:fit.top + fit.height, fit.left:fit.left + fit.width] = resized
    return canvas


def mask_to_file(mask: np.ndarray, fit: Fit) -> np.ndarray:
    """A (H, W) class mask of the model's input -> the file's size: the image's part of the canvas, resized by
    nearest neighbour (classes are not averaged)."""
    from PIL import Image

    part = mask[fit.top:fit.top + fit.height, fit.left:fit.left + fit.width]
    resized = Image.fromarray(part.astype(np.int32)).resize((fit.file_width, fit.file_height), Image.Resampling.NEAREST)
    return np.asarray(resized).astype(mask.dtype)


def read_fitted(path: Union[str, BinaryIO], size: int, mode: str, grayscale: bool = False,
                pad: bool = False) -> tuple[np.ndarray, Fit]:
    """float32 (C, H, W) in [0, 1] as `mode` fits the image to `size` (bilinear), and where it landed; the canvas
    around it is gray for letterbox, black for a padded keep_aspect."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("L" if grayscale else "RGB")
        fit = fit_image(img.width, img.height, size, mode, pad)
        resized = img.resize((fit.width, fit.height), Image.Resampling.BILINEAR)
        arr = np.asarray(resized, dtype=np.float32) / 255.0
    arr = arr[None] if grayscale else arr.transpose(2, 0, 1)
    if (fit.canvas_width, fit.canvas_height) != (fit.width, fit.height):
        fill = LETTERBOX_FILL if mode == "letterbox" else 0.0
        canvas = np.full((arr.shape[0], fit.canvas_height, fit.canvas_width), fill, dtype=np.float32)
        canvas[:, fit.top:fit.top + fit.height, fit.left:fit.left + fit.width] = arr
        arr = canvas
    return np.ascontiguousarray(arr), fit
