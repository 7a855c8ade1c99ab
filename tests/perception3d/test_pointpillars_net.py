"""The PointPillars network (models/pointpillars.py, issue 52): each pillar lands at its cell of the pseudo-image,
padding pillars change nothing (not the features, not batch norm's statistics), and the head's maps have the grid's
shape at stride 2."""
from __future__ import annotations

import numpy as np
import torch

from lidar_data import make_scenes
from trainforge.models.pointpillars import MaskedBatchNorm, PointPillars, scatter_to_bev
from trainforge.points3d import grid_size, voxelize

RANGE = [0.0, -25.6, -3.0, 40.96, 25.6, 1.0]
VOXEL = [0.32, 0.32, 4.0]


def padded(points: np.ndarray, max_voxels: int):
    p = voxelize(points, RANGE, VOXEL, 16, max_voxels)
    v = len(p.counts)
    voxels = torch.zeros(1, max_voxels, 16, 4)
    voxels[0, :v] = torch.from_numpy(p.voxels)
    counts = torch.zeros(1, max_voxels, dtype=torch.long)
    counts[0, :v] = torch.from_numpy(p.counts)
    coords = torch.zeros(1, max_voxels, 2, dtype=torch.long)
    coords[0, :v] = torch.from_numpy(p.coords)
    return voxels, counts, coords, v


def test_scatter_puts_each_pillar_at_its_cell_and_drops_padding():
    features = torch.arange(1, 13, dtype=torch.float32).reshape(1, 4, 3)
    coords = torch.tensor([[[0, 1], [2, 3], [1, 0], [0, 0]]])
    counts = torch.tensor([[5, 1, 2, 0]])  # the last is padding: at (0, 0) it would overwrite nothing
    bev = scatter_to_bev(features, coords, counts, rows=3, columns=4)
    assert bev.shape == (1, 3, 3, 4)
    assert bev[0, :, 0, 1].tolist() == [1, 2, 3] and bev[0, :, 2, 3].tolist() == [4, 5, 6]
    assert bev[0, :, 1, 0].tolist() == [7, 8, 9] and bev[0, :, 0, 0].tolist() == [0, 0, 0]
    assert bev.abs().sum() == features[0, :3].sum()


def test_padding_pillars_change_neither_the_output_nor_batch_norm():
    points = make_scenes(1, seed=2)[0].points
    torch.manual_seed(0)
    columns, rows = grid_size(RANGE, VOXEL)
    net = PointPillars(3, 4, RANGE, VOXEL, (columns, rows), channels=(16, 32, 32), layers=(1, 1, 1), up_channels=16,
                       head_channels=16)
    a = padded(points, 4000)
    b = padded(points, 6000)
    assert a[3] == b[3] < 4000
    net.train()
    out_a = net(dict(zip(("voxels", "counts", "coords"), a[:3])))
    stats_a = net.pillars.norm.running_mean.clone()
    torch.manual_seed(0)
    again = PointPillars(3, 4, RANGE, VOXEL, (columns, rows), channels=(16, 32, 32), layers=(1, 1, 1), up_channels=16,
                         head_channels=16).train()
    out_b = again(dict(zip(("voxels", "counts", "coords"), b[:3])))
    assert torch.allclose(again.pillars.norm.running_mean, stats_a, atol=1e-6)
    for name in out_a:
        assert torch.allclose(out_a[name], out_b[name], atol=1e-5), name
    assert out_a["heatmap"].shape == (1, 3, rows // 2, columns // 2) and out_a["size"].shape == (1, 3, rows // 2, columns // 2)
    assert out_a["heading"].shape[1] == 2 and out_a["offset"].shape[1] == 2 and out_a["z"].shape[1] == 1


def test_masked_batch_norm_is_batch_norm_over_the_real_rows():
    torch.manual_seed(1)
    x = torch.randn(5, 7, 4)
    mask = torch.rand(5, 7) > 0.4
    ours = MaskedBatchNorm(4, momentum=0.1, eps=1e-5).train()
    theirs = torch.nn.BatchNorm1d(4, momentum=0.1, eps=1e-5).train()
    got = ours(x, mask)[mask]
    want = theirs(x[mask])
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.allclose(ours.running_mean, theirs.running_mean) and torch.allclose(ours.running_var, theirs.running_var)


def test_the_folded_norm_is_a_linear_layer_then_batch_norm_over_the_real_rows():
    """The pillar net's linear layer and masked batch norm as one affine map (its statistics from the features'
    moments) against torch's Linear and BatchNorm1d on the real rows: outputs, running statistics, gradients; and in
    eval mode against the running statistics."""
    torch.manual_seed(3)
    features = torch.randn(3, 50, 6, 9) * 2 + 1
    mask = torch.rand(3, 50, 6) > 0.5
    features = features * mask.unsqueeze(-1)
    linear = torch.nn.Linear(9, 16, bias=False)
    ours = MaskedBatchNorm(16, momentum=0.1, eps=1e-3).train()
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-0.5, 0.5)
    theirs = torch.nn.BatchNorm1d(16, momentum=0.1, eps=1e-3).train()
    theirs.load_state_dict({k: v.clone() for k, v in ours.state_dict().items()}, strict=False)
    w_ours = linear.weight.detach().clone().requires_grad_(True)
    w_theirs = linear.weight.detach().clone().requires_grad_(True)
    weight, bias = ours.folded(features, mask, w_ours)
    got = torch.nn.functional.linear(features, weight, bias)[mask]
    want = theirs(torch.nn.functional.linear(features[mask], w_theirs))
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.allclose(ours.running_mean, theirs.running_mean, atol=1e-5)
    assert torch.allclose(ours.running_var, theirs.running_var, rtol=1e-4)
    probe = torch.randn_like(want)
    (got * probe).sum().backward()
    (want * probe).sum().backward()
    assert torch.allclose(w_ours.grad, w_theirs.grad, atol=1e-3, rtol=1e-3)
    ours.eval()
    theirs.eval()
    weight, bias = ours.folded(features, mask, w_ours)
    assert torch.allclose(torch.nn.functional.linear(features, weight, bias)[mask],
                          theirs(torch.nn.functional.linear(features[mask], w_theirs)), atol=1e-4)


def test_the_registered_factory_builds_it_for_the_datas_pillar_grid():
    from trainforge.config import ModelConfig
    from trainforge.data.base import DataInfo
    from trainforge.errors import UserError
    from trainforge.models import build_model

    info = DataInfo("detection3d", "pointcloud", (500, 16, 4), "float32", 3, ("Car", "Pedestrian", "Cyclist"),
                    pillar_grid=(*RANGE, *VOXEL, 16, 500, 800))
    model, spec = build_model(ModelConfig(name="pointpillars", args={"channels": [16, 32, 32], "layers": [1, 1, 1]}),
                              info)
    example = spec.example(2)
    assert example["voxels"].shape == (2, 500, 16, 4) and example["coords"].shape == (2, 500, 2)
    out = model(example)
    assert out["heatmap"].shape == (2, 3, 80, 64)
    for args, field in (({"layers": [1, 2]}, "layers"), ({"channels": [16, 0, 8]}, "channels[1]")):
        try:
            build_model(ModelConfig(name="pointpillars", args=args), info)
        except UserError as e:
            assert f"model.args.{field}" in str(e)
        else:
            raise AssertionError(args)
