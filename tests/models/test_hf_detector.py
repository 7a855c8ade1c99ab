"""`model.name: hf` on detection data: a transformers detector (DETR) in torchvision's detection convention, which
the detection task speaks. A tiny DETR fitted to one image finds its box where it is: the targets' pixel xyxy boxes
reach DETR's losses as normalized (cx, cy, w, h), and its queries come back as pixel xyxy boxes."""
from __future__ import annotations

import pytest
import torch
from torchvision.ops import box_iou

from tiny_models import TINY_DETR, save_tiny_detr
from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model

INFO = DataInfo("detection", "image", (3, 48, 48), "float32", 3, ("__background__", "box", "disc"))


def hf(**args):
    return build_model(ModelConfig(name="hf", args=args), INFO)[0]


def detr():
    return hf(pretrained=False, config={"model_type": "detr", **TINY_DETR})


def test_a_tiny_detr_fitted_to_one_image_finds_its_box():
    torch.manual_seed(0)
    model = detr()
    image = torch.rand(1, 3, 48, 48) * 0.2
    image[0, 0, 10:30, 20:44] = 1.0  # a red box at x 20..44, y 10..30
    target = {"boxes": torch.tensor([[20.0, 10.0, 44.0, 30.0]]), "labels": torch.tensor([2])}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(150):
        losses = model(image, [target])
        assert set(losses) == {"loss"} and losses["loss"].dim() == 0
        optimizer.zero_grad()
        losses["loss"].backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        (found,) = model([image[0]])
    assert set(found) == {"boxes", "scores", "labels"} and (found["labels"] != 0).all()
    best = found["scores"].argmax()
    assert found["labels"][best] == 2
    assert box_iou(found["boxes"][best:best + 1], target["boxes"])[0, 0] > 0.7, found["boxes"][best]


def test_images_of_two_sizes_in_one_batch_are_padded_with_a_mask_and_answered_in_their_own_pixels():
    """Issue 55: data.args.resize keep_aspect gives each image its own aspect; DETR takes them padded at the bottom
    and right (as transformers' processors pad), the pixel mask saying which pixels are real, and reports each
    image's boxes in its own pixels. Its losses normalize each image's boxes by that image's size."""
    torch.manual_seed(0)
    model = detr().eval()
    wide, tall = torch.rand(3, 16, 48), torch.rand(3, 48, 24)
    x, mask, sizes = model._batch([wide, tall])
    assert tuple(x.shape) == (2, 3, 48, 48) and sizes == [(16, 48), (48, 24)]
    assert mask[0, :16].all() and not mask[0, 16:].any() and mask[1, :, :24].all() and not mask[1, :, 24:].any()
    assert (x[0, :, 16:] == 0).all() and (x[1, :, :, 24:] == 0).all()  # padded after normalization: zeros
    with torch.no_grad():
        found = model([wide, tall])
    for one, (h, w) in zip(found, sizes):
        assert len(one["boxes"]) and (one["boxes"][:, [0, 2]] <= w + 1e-3).all() and (one["boxes"][:, [1, 3]] <= h + 1e-3).all()
    model.train()
    losses = model([wide, tall], [{"boxes": torch.tensor([[2.0, 2.0, 20.0, 12.0]]), "labels": torch.tensor([1])},
                                  {"boxes": torch.tensor([[4.0, 10.0, 20.0, 40.0]]), "labels": torch.tensor([2])}])
    assert torch.isfinite(losses["loss"])


def test_pretrained_true_loads_the_weights_config_names_and_false_builds_random_ones(tmp_path):
    saved = save_tiny_detr(tmp_path / "detr", num_labels=3, seed=3)
    loaded = hf(config=str(saved), pretrained=True)
    fresh = hf(config=str(saved), pretrained=False)
    from transformers import AutoModelForObjectDetection

    want = AutoModelForObjectDetection.from_pretrained(saved).state_dict()
    key = "model.input_projection.weight"
    assert torch.equal(loaded.model.state_dict()[key], want[key])
    assert not torch.equal(fresh.model.state_dict()[key], want[key])
    with pytest.raises(UserError, match="model.args.pretrained"):
        hf(pretrained=True)
