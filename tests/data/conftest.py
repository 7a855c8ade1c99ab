from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from data_helpers import write_png


@pytest.fixture
def image_tree(tmp_path: Path) -> Path:
    """3 classes x 6 random PNGs, plus one duplicate, one truncated PNG, one text file named .jpg."""
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for name in ("cat", "dog", "fox"):
        for i in range(6):
            write_png(root / name / f"{i}.png", rng)
    (root / "dog" / "zz_copy.png").write_bytes((root / "cat" / "0.png").read_bytes())
    good = (root / "fox" / "0.png").read_bytes()
    (root / "fox" / "truncated.png").write_bytes(good[: len(good) // 2])
    (root / "cat" / "notes.jpg").write_text("this is not an image")
    (root / "cat" / "README.txt").write_text("ignored: not an image suffix")
    return root
