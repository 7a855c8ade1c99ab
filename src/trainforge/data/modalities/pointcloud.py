"""Point clouds: (N, F) float32 LiDAR points (x, y, z in metres, the sensor's frame, then intensity), a frame's worth
of any N; the task cuts them into pillars (trainforge.points3d)."""
from __future__ import annotations

from typing import Any

from trainforge.data.modalities.base import Modality, register_modality


@register_modality
class PointCloud(Modality):
    name = "pointcloud"
    description = "LiDAR points (N, F): objects pasted in; turned, scaled, mirrored with their boxes; cut into pillars"
    spatial_dims = 0
    scaled = False  # metres and a reflectance: the pillar net's batch norm scales them
    served = "point cloud files (.bin, .npy, .pcd)"

    def augmenter(self, cfg: Any, info: Any, value_range: tuple[float, float], task: Any) -> tuple[Any, tuple[str, ...], str]:
        from trainforge.data.stages.augment import POINT_OPS, build_point_augment

        return (build_point_augment(cfg), POINT_OPS,
                "a point cloud takes data.augment.gt_sampling, world_rotation_deg, world_scaling and world_flip")
