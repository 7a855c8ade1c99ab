"""PointPillars (Lang et al., CVPR 2019) in plain PyTorch, with CenterPoint's centre-heatmap head (Yin et al.,
CVPR 2021): no compiled ops, so it runs on the CPU and on any GPU, and it exports to ONNX as one graph.

    pillars (B, V, P, F) + counts (B, V) + coords (B, V, 2)
      -> pillar feature net: a PointNet over each pillar's points (each point with its offset from the pillar's
         mean and from the pillar's centre), max over the points            -> (B, V, C)
      -> scatter to the BEV pseudo-image                                    -> (B, C, rows, columns)
      -> 2D backbone (three strided blocks) and an upsampling neck, concatenated -> (B, 3 x U, rows/s, columns/s)
      -> head: per-class centre heatmap logits, and at each cell the centre's offset within it, z, log size, the
         box's axis as (sin, cos) of twice the yaw and the direction along it (a logit)
                                                     -> {"heatmap", "offset", "z", "size", "heading", "direction"}

Shapes are fixed by the batch's V (max_voxels; a padding pillar has count 0 and is scattered to a cell that is
dropped), so a fake-tensor simulation follows a training step exactly. Batch norm over the points counts real points
only (MaskedBatchNorm): padding never shifts the statistics. What the maps mean (targets, loss, decoding to boxes)
belongs to the detection3d task.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import args as check
from trainforge.models.base import InputSpec, NamedInputs
from trainforge.models.zoo import DataFit, register_model
from trainforge.points3d import grid_size
from trainforge.tasks.centers3d import OUTPUT_STRIDE

HEAD_CHANNELS = {"offset": 2, "z": 1, "size": 3, "heading": 2, "direction": 1}
HEATMAP_PRIOR = 0.1  # the heatmap logits start at the log-odds of 0.1 (CenterNet's -2.19): few cells are centres


class MaskedBatchNorm(nn.Module):
    """Batch norm over the last dimension of x (..., C) counting only the rows where mask (...) is true."""

    def __init__(self, channels: int, momentum: float = 0.1, eps: float = 1e-3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.momentum, self.eps = momentum, eps

    @torch.no_grad()
    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: torch.Tensor) -> None:
        """The running statistics move towards this batch's mean and unbiased variance (n real rows)."""
        unbiased = var * n / (n - 1).clamp_min(1.0)
        self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
        self.running_var.lerp_(unbiased.detach().to(self.running_var.dtype), self.momentum)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        w = mask.to(x.dtype).unsqueeze(-1)
        if self.training:
            dims = tuple(range(x.dim() - 1))
            n = w.sum().clamp_min(1.0)
            mean = (x * w).sum(dims) / n
            var = (((x - mean) ** 2) * w).sum(dims) / n
            self._update_running(mean, var, n)
        else:
            mean, var = self.running_mean.to(x.dtype), self.running_var.to(x.dtype)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias

    def folded(self, features: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This norm after a bias-free linear layer (`weight` (C, F)) on `features` (..., F), zero where mask is
        false, as one affine map: (weight', bias') with linear(features, weight', bias') = norm(linear(features,
        weight)) on the rows where mask is true. The statistics come from the features' mean (F,) and second moment
        (F, F), a few small matrix products, instead of passes over the (..., C) output: the pillar net's cost."""
        if self.training:
            flat = features.reshape(-1, features.shape[-1])
            n = mask.sum().to(flat.dtype).clamp_min(1.0)
            mean_f = flat.sum(0) / n
            cov = flat.t() @ flat / n - torch.outer(mean_f, mean_f)  # (F, F) over the real rows (padding rows are 0)
            mean = weight @ mean_f
            var = ((weight @ cov) * weight).sum(1).clamp_min(0.0)  # diag(W cov W^T)
            self._update_running(mean, var, n)
        else:
            mean, var = self.running_mean.to(weight.dtype), self.running_var.to(weight.dtype)
        scale = self.weight / torch.sqrt(var + self.eps)
        return weight * scale.unsqueeze(1), self.bias - mean * scale


class PillarFeatureNet(nn.Module):
    """Each pillar's points, with their offsets from the pillar's mean (3) and from its centre (x, y), through a
    linear layer, masked batch norm (folded into the linear layer: MaskedBatchNorm.folded) and ReLU, then the max
    over the pillar's points."""

    def __init__(self, point_features: int, channels: int, voxel_size, point_cloud_range) -> None:
        super().__init__()
        self.linear = nn.Linear(point_features + 5, channels, bias=False)
        self.norm = MaskedBatchNorm(channels)
        self.register_buffer("cell", torch.tensor([voxel_size[0], voxel_size[1]], dtype=torch.float32))
        self.register_buffer("origin", torch.tensor([point_cloud_range[0], point_cloud_range[1]], dtype=torch.float32))

    def forward(self, voxels: torch.Tensor, counts: torch.Tensor, coords: torch.Tensor) -> torch.Tensor:
        points = voxels.shape[-2]
        mask = torch.arange(points, device=voxels.device) < counts.unsqueeze(-1)       # (B, V, P)
        w = mask.to(voxels.dtype).unsqueeze(-1)
        xyz = voxels[..., :3]
        mean = (xyz * w).sum(-2, keepdim=True) / counts.clamp_min(1).to(voxels.dtype)[..., None, None]
        centre = (coords.flip(-1).to(voxels.dtype) + 0.5) * self.cell + self.origin    # (B, V, 2) as x, y
        features = torch.cat([voxels, xyz - mean, xyz[..., :2] - centre.unsqueeze(-2)], dim=-1) * w
        weight, bias = self.norm.folded(features, mask, self.linear.weight)             # linear + norm, one map
        x = torch.relu(torch.nn.functional.linear(features, weight, bias)) * w          # padding points: 0
        x = x.amax(dim=-2)                              # (B, V, C): a real point's value is >= 0, so padding's 0
        return torch.where(counts.unsqueeze(-1) > 0, x, torch.zeros_like(x))  # never wins unless it ties


def scatter_to_bev(features: torch.Tensor, coords: torch.Tensor, counts: torch.Tensor, rows: int,
                   columns: int) -> torch.Tensor:
    """(B, V, C) pillar features into (B, C, rows, columns): each pillar at its (row, column); padding pillars
    (count 0) go to an extra cell that is cut off."""
    b, _, c = features.shape
    cells = rows * columns
    index = torch.where(counts > 0, coords[..., 0] * columns + coords[..., 1], torch.full_like(counts, cells))
    canvas = features.new_zeros(b, cells + 1, c)
    canvas = canvas.scatter(1, index.unsqueeze(-1).expand(-1, -1, c), features)
    return canvas[:, :cells].transpose(1, 2).reshape(b, c, rows, columns)


def _block(cin: int, cout: int, stride: int, layers: int) -> nn.Sequential:
    mods: list[nn.Module] = [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.1),
                             nn.ReLU()]
    for _ in range(layers):
        mods += [nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.1), nn.ReLU()]
    return nn.Sequential(*mods)


class Backbone2D(nn.Module):
    """SECOND's 2D backbone: blocks at strides 2, 4, 8 of the pseudo-image (by default), each upsampled to stride 2
    and concatenated."""

    def __init__(self, cin: int, channels=(64, 128, 256), layers=(3, 5, 5), up_channels: int = 128) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        self.ups = nn.ModuleList()
        c = cin
        for i, (cout, n) in enumerate(zip(channels, layers)):
            self.blocks.append(_block(c, cout, 2, n))
            scale = 2 ** i  # this block's output is at stride 2^(i+1): back to stride 2
            up = (nn.ConvTranspose2d(cout, up_channels, scale, scale, bias=False) if scale > 1
                  else nn.Conv2d(cout, up_channels, 1, bias=False))
            self.ups.append(nn.Sequential(up, nn.BatchNorm2d(up_channels, eps=1e-3, momentum=0.1), nn.ReLU()))
            c = cout
        self.out_channels = up_channels * len(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for block, up in zip(self.blocks, self.ups):
            x = block(x)
            outs.append(up(x))
        return torch.cat(outs, dim=1)


class CenterHead(nn.Module):
    def __init__(self, cin: int, num_classes: int, channels: int = 64) -> None:
        super().__init__()
        self.shared = nn.Sequential(nn.Conv2d(cin, channels, 3, 1, 1, bias=False), nn.BatchNorm2d(channels), nn.ReLU())
        self.heads = nn.ModuleDict()
        for name, out in {"heatmap": num_classes, **HEAD_CHANNELS}.items():
            self.heads[name] = nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1, bias=False),
                                             nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, out, 1))
        nn.init.constant_(self.heads["heatmap"][-1].bias, math.log(HEATMAP_PRIOR / (1 - HEATMAP_PRIOR)))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.shared(x)
        return {name: head(x) for name, head in self.heads.items()}


class PointPillars(nn.Module):
    """The network: pillars -> the head's maps at stride 2 of the BEV grid (`output_stride`)."""

    output_stride = OUTPUT_STRIDE  # three halvings, upsampled back to the first

    def __init__(self, num_classes: int, point_features: int, point_cloud_range, voxel_size, grid: tuple[int, int],
                 pillar_channels: int = 64, channels=(64, 128, 256), layers=(3, 5, 5), up_channels: int = 128,
                 head_channels: int = 64) -> None:
        super().__init__()
        self.columns, self.rows = grid
        if self.rows % 8 or self.columns % 8:
            raise ValueError(f"the BEV grid ({self.columns} x {self.rows} cells) must be a multiple of 8 each way for "
                             "the backbone's three halvings")
        self.pillars = PillarFeatureNet(point_features, pillar_channels, voxel_size, point_cloud_range)
        self.backbone = Backbone2D(pillar_channels, channels, layers, up_channels)
        self.head = CenterHead(self.backbone.out_channels, num_classes, head_channels)

    def forward(self, pillars: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """pillars: {"voxels" (B, V, P, F), "counts" (B, V), "coords" (B, V, 2)}, as the task's collate makes them."""
        voxels, counts, coords = pillars["voxels"], pillars["counts"], pillars["coords"]
        features = self.pillars(voxels, counts, coords)
        bev = scatter_to_bev(features, coords, counts, self.rows, self.columns)
        return self.head(self.backbone(bev))


POINT_CLOUDS = DataFit("3D detection (task detection3d: LiDAR point clouds cut into pillars)",
                       lambda info: len(info.pillar_grid) == 12, ("detection3d",))
MAX_WIDTH = 4096  # channels of any layer


def _widths(key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 3:
        raise UserError(f"model.args.{key}: expected 3 integers (one a backbone block), got {value!r}")
    out = tuple(check.positive_int(f"{key}[{i}]", v) for i, v in enumerate(value))
    if max(out) > MAX_WIDTH:
        raise UserError(f"model.args.{key}: at most {MAX_WIDTH} each, got {list(out)}")
    return out


def _depths(value: Any) -> tuple[int, ...]:
    if (not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 32 for v in value)):
        raise UserError(f"model.args.layers: expected 3 integers from 0 to 32 (extra convolutions a block), got "
                        f"{value!r}")
    return tuple(value)


@register_model("pointpillars", fits=POINT_CLOUDS)
def build_pointpillars(info: DataInfo, pillar_channels: int = 64, channels: Sequence[int] = (64, 128, 256),
                       layers: Sequence[int] = (3, 5, 5), up_channels: int = 128,
                       head_channels: int = 64) -> tuple[nn.Module, NamedInputs]:
    """PointPillars for the data's pillar grid; its inputs are the task's batch of pillars (training's cap)."""
    g = info.pillar_grid
    point_cloud_range, voxel_size, max_points, max_voxels = g[:6], g[6:9], int(g[9]), int(g[10])
    columns, rows = grid_size(point_cloud_range, voxel_size)
    if rows % 8 or columns % 8:
        raise UserError(f"data.args.point_cloud_range: its {columns} x {rows} pillars must be a multiple of 8 each way "
                        "(the backbone halves the grid three times); widen the range or change voxel_size")
    for key, value in (("pillar_channels", pillar_channels), ("up_channels", up_channels),
                       ("head_channels", head_channels)):
        if check.positive_int(key, value) > MAX_WIDTH:
            raise UserError(f"model.args.{key}: at most {MAX_WIDTH}, got {value}")
    features = int(info.input_shape[-1])
    model = PointPillars(info.num_classes, features, point_cloud_range, voxel_size, (columns, rows),
                         pillar_channels=pillar_channels, channels=_widths("channels", channels), layers=_depths(layers),
                         up_channels=up_channels, head_channels=head_channels)
    spec = NamedInputs((("voxels", InputSpec((max_voxels, max_points, features), torch.float32)),
                        ("counts", InputSpec((max_voxels,), torch.int64, high=max_points + 1)),
                        ("coords", InputSpec((max_voxels, 2), torch.int64, high=min(rows, columns)))))
    return model, spec
