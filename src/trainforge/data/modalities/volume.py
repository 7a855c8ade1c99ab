"""Volumes: (C, D, H, W) float32 voxels of a CT or MRI scan, prepared by MONAI as the volumes source says."""
from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Sequence

from trainforge.data.modalities.base import Modality, Reader, Sample, register_modality
from trainforge.data.modalities.inputs import STDIN, input_shape, normalization, normalize
from trainforge.errors import UserError


@register_modality
class Volume(Modality):
    name = "volume"
    description = "3-D scans (C, D, H, W): normalized per channel, augmented by flips along each axis and an offset"
    spatial_dims = 3
    scaled = True
    served = "NIfTI files (.nii, .nii.gz) or DICOM series folders"

    def augmenter(self, cfg: Any, info: Any, value_range: tuple[float, float], task: Any) -> tuple[Any, tuple[str, ...], str]:
        from trainforge.data.stages.augment import VOLUME_OPS, build_volume_augment

        return build_volume_augment(cfg), VOLUME_OPS, "a volume takes data.augment.hflip, vflip, dflip and intensity_shift"

    def reader(self, meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
        """NIfTI files and DICOM series folders -> float32 (C, D, H, W), prepared as the volumes source prepared the
        training data (the stored orientation, spacing, window, size; MONAI), then normalization."""
        shape = input_shape(meta, 4, artifact)
        pre = meta.get("preprocess", {})
        settings = pre.get("volume")
        if not isinstance(settings, dict) or list(pre.get("patch") or settings.get("size") or []) != shape[1:]:
            raise UserError(f"{artifact}: its metadata lacks the volume preprocessing of its {shape[1:]} input; re-export it")
        shift_scale = normalization(pre.get("normalize"), shape[0], self.channel_view, artifact)
        what = "NIfTI files (.nii, .nii.gz) or DICOM series folders"

        def read(inputs: Sequence[str]) -> Iterator[Sample]:
            from trainforge.data.sources.volumes import NIFTI_SUFFIXES, prepare_volume  # MONAI: only volumes need it

            for name in inputs:
                path = Path(name)
                if name == STDIN or not path.exists():
                    raise UserError(f"INPUT: {name} does not exist; pass {what}")
                if path.is_file() and not path.name.lower().endswith(NIFTI_SUFFIXES):
                    raise UserError(f"INPUT: {name} is not a NIfTI file (.nii, .nii.gz); pass {what}")
            for name in inputs:
                try:
                    x = prepare_volume(name, settings)
                except Exception as e:  # MONAI, nibabel and pydicom raise many types for a file they cannot read
                    reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                    raise UserError(f"INPUT: {name} is not a readable volume ({reason}); pass {what}") from None
                yield name, normalize(x, shift_scale)

        return read
