"""Reading one image (a file, or its bytes as a file object) into the array the models take; numpy and Pillow
only (`predict` reuses it)."""
from __future__ import annotations

from typing import BinaryIO, Union

import numpy as np
from PIL import Image

from trainforge.data.image.preprocess import ImagePreprocess


def read_image(path: Union[str, BinaryIO], image_size: int, grayscale: bool) -> np.ndarray:
    """float32 (C, S, S) in [0, 1], resized bilinearly to S x S; C is 1 for grayscale, else 3."""
    with Image.open(path) as img:
        img = img.convert("L" if grayscale else "RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
        arr = np.asarray(img, dtype=np.float32) / 255.0
    return np.ascontiguousarray(arr[None] if grayscale else arr.transpose(2, 0, 1))


def read_model_image(path: Union[str, BinaryIO], preprocess: ImagePreprocess, grayscale: bool) -> np.ndarray:
    """float32 (C, H, W) in [0, 1], resized and cropped as a pretrained model expects (`data.normalize: model`)."""
    with Image.open(path) as img:
        return preprocess.apply_pil(img, grayscale)
