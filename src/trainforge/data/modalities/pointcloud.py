"""Point clouds: (N, F) float32 LiDAR points (x, y, z in metres, the sensor's frame, then intensity), a frame's worth
of any N; the task cuts them into pillars (trainforge.points3d)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, Sequence

from trainforge.data.modalities.base import Modality, Reader, Sample, register_modality
from trainforge.data.modalities.inputs import require_files
from trainforge.errors import UserError

MAX_POINTS_BYTES = 1 << 30  # one points file predict reads (a 128-beam frame is about 10 MB)


@register_modality
class PointCloud(Modality):
    name = "pointcloud"
    description = "LiDAR points (N, F): objects pasted in; turned, scaled, mirrored with their boxes; cut into pillars"
    spatial_dims = 0
    scaled = False  # metres and a reflectance: the pillar net's batch norm scales them
    served = "point cloud files (.bin, .npy, .pcd)"
    own_suffixes = (".npy",)  # an (N, F) array of points is a point cloud file, read as training read it

    def augmenter(self, cfg: Any, info: Any, value_range: tuple[float, float], task: Any) -> tuple[Any, tuple[str, ...], str]:
        from trainforge.data.stages.augment import POINT_OPS, build_point_augment

        return (build_point_augment(cfg), POINT_OPS,
                "a point cloud takes data.augment.gt_sampling, world_rotation_deg, world_scaling and world_flip")

    def reader(self, meta: dict[str, Any], artifact: str, stdin: Optional[BinaryIO] = None) -> Reader:
        """Points files (.bin of the run's `bin_features` float32 values a point, .npy, .pcd) -> float32 (N, F): the
        finite points inside the run's point_cloud_range, cut to its point_features, as training read them."""
        from trainforge.points3d import FEATURES, POINT_SUFFIXES, model_points, read_points

        pre = meta.get("preprocess") or {}
        point_range, features, bin_features = (pre.get("point_cloud_range"), pre.get("point_features"),
                                               pre.get("bin_features", 4))
        valid = (isinstance(point_range, list) and len(point_range) == 6
                 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in point_range)
                 and isinstance(features, list) and features[:3] == ["x", "y", "z"]
                 and all(f in FEATURES for f in features)
                 and isinstance(bin_features, int) and not isinstance(bin_features, bool) and 3 <= bin_features <= 64)
        if not valid:
            raise UserError(f"{artifact}: its point cloud preprocessing (point_cloud_range, point_features, "
                            "bin_features) is missing or damaged; re-export it with `trainforge compress`")

        def read(inputs: Sequence[str]) -> Iterator[Sample]:
            require_files(inputs, f"point cloud files ({', '.join(POINT_SUFFIXES)})", allow_stdin=False)
            for name in inputs:
                if Path(name).stat().st_size > MAX_POINTS_BYTES:
                    raise UserError(f"INPUT: {name} is over {MAX_POINTS_BYTES >> 30} GiB, not one LiDAR frame; pass "
                                    "one frame a file")
                try:
                    points = model_points(read_points(name, bin_features), point_range, features)
                except Exception as e:  # numpy and pypcd4 raise many types for a file that is not one
                    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                    raise UserError(f"INPUT: {name} is not a readable point cloud ({reason}); pass "
                                    f"{', '.join(POINT_SUFFIXES)} files of x, y, z, intensity") from None
                yield name, points

        return read
