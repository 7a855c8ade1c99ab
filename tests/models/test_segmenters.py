"""`model.name: segmenter` (issue 28): every torchvision segmentation model builds for the data's classes, takes
[0, 1] images and returns logits at the image's size, and trains through the segmentation task; torchvision-format
weights load from a file with the classifier's last layer left new; the planner simulates it like any model."""
from __future__ import annotations

import pytest
import torch
import torchvision

from trainforge.config import ModelConfig, OptimConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.models.segmenters import ARCHS
from trainforge.planning.simulate import simulate_step
from trainforge.tasks import task_of

INFO = DataInfo("segmentation", "image", (3, 48, 48), "float32", 3, ("background", "box", "disc"))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_segmenter_gives_logits_at_the_image_size_and_trains_through_the_task(arch):
    torch.manual_seed(0)
    model, _ = build_model(ModelConfig(name="segmenter", args={"arch": arch, "pretrained": False}), INFO)
    task = task_of(INFO)
    images, masks = torch.rand(2, 3, 48, 48), torch.randint(0, 3, (2, 48, 48))
    masks[:, :4] = 255  # unlabelled rows: no loss
    logits = task.forward(model.train(), (images, masks))
    assert logits.shape == (2, 3, 48, 48)
    loss = task.training_loss(logits, (images, masks))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_torchvision_weights_load_from_a_file_and_the_last_layer_stays_new(tmp_path):
    arch = "lraspp_mobilenet_v3_large"
    torch.manual_seed(1)
    voc = torchvision.models.get_model(arch, weights=None, weights_backbone=None)  # VOC's 21 classes
    torch.save(voc.state_dict(), tmp_path / "voc.pth")
    model, _ = build_model(ModelConfig(name="segmenter", args={"arch": arch, "pretrained": str(tmp_path / "voc.pth")}),
                           INFO)
    own, saved = model.model.state_dict(), voc.state_dict()
    new = {k for k in saved if own[k].shape != saved[k].shape}
    assert new and all(k.startswith("classifier.") for k in new)  # the layers that give the 21 (now 3) classes
    assert all(torch.equal(own[k], saved[k]) for k in saved if k not in new)


def test_the_planner_simulates_a_segmenter_step():
    sim = simulate_step(ModelConfig(name="segmenter", args={"arch": "lraspp_mobilenet_v3_large", "pretrained": False}),
                        OptimConfig(name="adamw", lr=1e-3), INFO, micro_batch_size=4)
    small = simulate_step(ModelConfig(name="segmenter", args={"arch": "lraspp_mobilenet_v3_large",
                                                              "pretrained": False}),
                          OptimConfig(name="adamw", lr=1e-3), INFO, micro_batch_size=1)
    assert sim.peak_bytes > small.peak_bytes > 0 and sim.breakdown["activations"] > small.breakdown["activations"]


@pytest.mark.parametrize("args, message", [
    ({"arch": "unet"}, r"model.args.arch: expected one of deeplabv3_mobilenet_v3_large"),
    ({"pretrained": True, "backbone_weights": True}, r"model.args.backbone_weights: the pretrained weights include"),
    ({"pretrained": 1.5}, r"model.args.pretrained: true"),
])
def test_wrong_arguments_are_one_line(args, message):
    with pytest.raises(UserError, match=message):
        build_model(ModelConfig(name="segmenter", args=args), INFO)


def test_deeplab_trains_on_a_micro_batch_of_one_image():
    """DeepLabV3's image-pooling BatchNorm sees one value per channel of a one-image batch: torch refuses to
    normalize it in training; trainforge's segmenter normalizes that batch with the running statistics instead."""
    model, _ = build_model(ModelConfig(name="segmenter", args={"arch": "deeplabv3_mobilenet_v3_large",
                                                               "pretrained": False}), INFO)
    model.train()
    pooling = model.model.classifier[0].convs[-1]  # ASPPPooling: pool, conv, norm, relu
    norm = pooling[2]
    before = norm.running_mean.clone()
    task_of(INFO).training_loss(model(torch.rand(1, 3, 48, 48)), (None, torch.randint(0, 3, (1, 48, 48)))).backward()
    assert torch.equal(norm.running_mean, before)  # one image: running statistics used, not updated
    model(torch.rand(2, 3, 48, 48))
    assert not torch.equal(norm.running_mean, before)  # two: BatchNorm as usual
