"""Generated multimodal data with a known answer: the label is (the camera image is bright) XOR (speed > 0), so the
image alone or the features alone are right half the time, both together always."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def write_drives(root: Path, n: int, seed: int, *, missing_images: int = 0, missing_features: int = 0,
                 side: int = 16) -> Path:
    """`n` rows in root/index.csv: camera (a PNG path), speed, load (numbers), weather (a category), label; the
    first `missing_images` rows have no camera cell and the next `missing_features` no speed."""
    rng = np.random.default_rng(seed)
    (root / "camera").mkdir(parents=True, exist_ok=True)
    lines = ["camera,speed,load,weather,label,drive"]
    for i in range(n):
        bright = bool(rng.integers(0, 2))
        speed = float(rng.normal()) * 2
        base = 170 if bright else 85
        pixels = np.clip(rng.normal(base, 25, (side, side, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / "camera" / f"{i}.png")
        label = "stop" if bright != (speed > 0) else "go"
        camera = "" if i < missing_images else f"camera/{i}.png"
        speed_cell = "" if missing_images <= i < missing_images + missing_features else f"{speed:.4f}"
        weather = ("rain", "sun", "fog")[int(rng.integers(0, 3))]
        lines.append(f"{camera},{speed_cell},{rng.normal():.4f},{weather},{label},d{i // 4}")
    (root / "index.csv").write_text("\n".join(lines) + "\n")
    return root / "index.csv"
