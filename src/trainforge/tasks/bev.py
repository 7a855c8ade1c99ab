"""A LiDAR frame seen from above (the bird's-eye view), with 3D boxes drawn on it: the report's `val_images.png` of
3D detection (true boxes green, predicted red) and `trainforge predict --images` (predicted boxes). numpy and Pillow.

    picture = bev_picture(points, point_cloud_range, truth=boxes, found=found_boxes, labels=["Car 0.91", ...])

x (forward) points up the picture and y (left) to the left, as a driver sees the road ahead; a point's brightness
is its height in the range. Each box is its footprint, with a line from its centre to the middle of its front edge
(the heading).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

TRUE_COLOUR = (60, 220, 60)
FOUND_COLOUR = (235, 50, 50)
LONGER_SIDE_PX = 640  # the picture's longer side


def footprint(box: Sequence[float]) -> np.ndarray:
    """A box's (x, y, z, l, w, h, yaw) four corners seen from above, (4, 2) in metres: front-left, front-right,
    rear-right, rear-left."""
    x, y, _, length, width, _, yaw = (float(v) for v in box[:7])
    c, s = np.cos(yaw), np.sin(yaw)
    local = np.array([[length, width], [length, -width], [-length, -width], [-length, width]]) / 2
    return local @ np.array([[c, s], [-s, c]]) + [x, y]


def bev_picture(points: np.ndarray, point_cloud_range: Sequence[float], *, truth: Optional[np.ndarray] = None,
                found: Optional[np.ndarray] = None, labels: Sequence[str] = ()) -> np.ndarray:
    """(H, W, 3) uint8: the points inside the range's x and y from above, `truth` boxes (n, 7) in green and `found`
    boxes (k, 7) in red, each found box labelled by `labels[i]` where given."""
    from PIL import Image, ImageDraw

    r = [float(v) for v in point_cloud_range]
    scale = LONGER_SIDE_PX / max(r[3] - r[0], r[4] - r[1])  # pixels a metre
    height, width = int(round((r[3] - r[0]) * scale)), int(round((r[4] - r[1]) * scale))

    def pixel(xy: np.ndarray) -> np.ndarray:  # (n, 2) metres -> (n, 2) as (column, row)
        return np.stack([(r[4] - xy[:, 1]) * scale, (r[3] - xy[:, 0]) * scale], axis=1)

    canvas = np.full((height, width, 3), 16, dtype=np.uint8)
    points = np.asarray(points, dtype=np.float64).reshape(-1, np.asarray(points).shape[-1] if np.ndim(points) else 3)
    if len(points):
        at = np.floor(pixel(points[:, :2])).astype(np.int64)
        keep = (at[:, 0] >= 0) & (at[:, 0] < width) & (at[:, 1] >= 0) & (at[:, 1] < height)
        level = np.clip((points[keep, 2] - r[2]) / max(r[5] - r[2], 1e-6), 0, 1)
        canvas[at[keep, 1], at[keep, 0]] = (90 + 165 * level)[:, None].astype(np.uint8)
    picture = Image.fromarray(canvas)
    draw = ImageDraw.Draw(picture)
    for boxes, colour, names in ((truth, TRUE_COLOUR, ()), (found, FOUND_COLOUR, labels)):
        for i, box in enumerate(np.asarray(boxes if boxes is not None else np.zeros((0, 7))).reshape(-1, 7)):
            corners = pixel(footprint(box))
            draw.polygon([tuple(p) for p in corners], outline=colour)
            centre, front = pixel(np.asarray(box[None, :2])), (corners[0] + corners[1]) / 2
            draw.line([tuple(centre[0]), tuple(front)], fill=colour)
            if i < len(names):
                draw.text(tuple(corners[0] + 2), names[i], fill=colour)
    return np.asarray(picture, dtype=np.uint8)


def grid_of(pictures: Sequence[np.ndarray], per_row: int = 2, gap: int = 4) -> Optional[np.ndarray]:
    """Pictures of one size side by side, `per_row` a row, white gaps; None without pictures."""
    if not pictures:
        return None
    h, w, _ = pictures[0].shape
    rows = -(-len(pictures) // per_row)
    out = np.full((rows * h + (rows - 1) * gap, per_row * w + (per_row - 1) * gap, 3), 255, dtype=np.uint8)
    for i, p in enumerate(pictures):
        top, left = (i // per_row) * (h + gap), (i % per_row) * (w + gap)
        out[top:top + h, left:left + w] = p
    return out
