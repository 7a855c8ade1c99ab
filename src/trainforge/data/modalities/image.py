"""Images: (C, H, W) float32 pixels on the source's scale (`value_range`; digits' 0..16 ink counts)."""
from __future__ import annotations

from typing import Any, BinaryIO, Callable, Iterator, Optional, Sequence

import numpy as np

from trainforge.data.modalities.base import Modality, Reader, Sample, register_modality
from trainforge.data.modalities.inputs import input_shape, normalization, normalize, require_files, to_value_range
from trainforge.errors import UserError


@register_modality
class Image(Modality):
    name = "image"
    description = "pictures (C, H, W): normalized per channel, augmented by crops, flips, rotation and colour"
    spatial_dims = 2
    scaled = True
    model_preprocessing = "apply"
    served = "image files (PNG, JPEG, ...)"

    def augmenter(self, cfg: Any, info: Any, value_range: tuple[float, float], task: Any) -> tuple[Any, tuple[str, ...], str]:
        from trainforge.data.stages.augment import IMAGE_OPS, build_augment  # torch: only when data is built

        return (build_augment(cfg, channels=info.input_shape[0], value_range=value_range), IMAGE_OPS,
                "token augmentation applies to text classification and flips in depth to volumes; this data is images")

    def record(self, value_range: tuple[float, float]) -> dict[str, Any]:
        return {"value_range": list(value_range)}  # predict scales [0, 1] pixels to it

    def reader(self, meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
        """Image files -> float32 (C, H, W), as the imagefolder source reads them, then value range and normalization."""
        shape = input_shape(meta, 3, artifact)
        pre = meta.get("preprocess", {})
        lo, hi = (float(v) for v in pre.get("value_range", (0.0, 1.0)))
        shift_scale = normalization(pre.get("normalize"), shape[0], self.channel_view, artifact)
        read_file = image_file_reader(pre, shape, artifact)

        def read(inputs: Sequence[str]) -> Iterator[Sample]:
            require_files(inputs, "image files (PNG, JPEG, ...)", allow_stdin=False)
            for name in inputs:
                try:
                    x, where = read_file(name)
                except Exception as e:  # Pillow raises many types (OSError, SyntaxError, ValueError ...) for bad files
                    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                    raise UserError(f"INPUT: {name} is not a readable image ({reason}); pass PNG, JPEG, ... files") from None
                x = normalize(to_value_range(x, lo, hi), shift_scale)
                yield (name, x, where) if where else (name, x)

        return read


def image_file_reader(pre: dict[str, Any], shape: list[int], artifact: str
                      ) -> Callable[[str], tuple[np.ndarray, dict[str, Any]]]:
    """An image file -> (float32 (C, H, W) in [0, 1], where it came from), as training read it: resized and cropped as
    the pretrained model expects when the run recorded that (`image_preprocess`); fitted as data.args.resize said for
    detection and segmentation (`resize`; where it came from: {"fit": trainforge.geometry.Fit as JSON}, so the task
    answers in the file's pixels); else resized to the square input size."""
    from trainforge.geometry import RESIZES, read_fitted
    from trainforge.data.image.preprocess import ImagePreprocess  # Pillow + numpy; the code training used
    from trainforge.data.image.read import read_image, read_model_image

    channels, height, width = shape
    if pre.get("image_preprocess") is not None:
        try:
            spec = ImagePreprocess.from_json(pre["image_preprocess"])
        except ValueError as e:
            raise UserError(f"{artifact}: its image_preprocess metadata is damaged ({e}); re-export it") from None
        if list(spec.output_shape) != shape:
            raise UserError(f"{artifact}: its image_preprocess gives {list(spec.output_shape)} inputs, the model takes "
                            f"{shape}; re-export it")
        grayscale = bool(pre.get("grayscale", False))
        return lambda name: (read_model_image(name, spec, grayscale), {})
    if pre.get("resize") in RESIZES and channels in (1, 3):
        mode, size = str(pre["resize"]), max(height, width)

        def fitted(name: str) -> tuple[np.ndarray, dict[str, Any]]:
            x, fit = read_fitted(name, size, mode, grayscale=channels == 1, pad=bool(pre.get("pad")))
            return x, {"fit": fit.to_json()}

        return fitted
    if height != width or channels not in (1, 3):
        raise UserError(
            f"{artifact}: the model takes {channels}x{height}x{width} inputs; predict reads images into square "
            "grayscale (1 channel) or RGB (3 channel) arrays only"
        )
    return lambda name: (read_image(name, height, grayscale=channels == 1), {})
