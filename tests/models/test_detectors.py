"""`model.name: detector` (issue 28): every torchvision detector builds for the data's classes, trains one step through
the detection task (its own loss dict) and detects in eval mode; torchvision-format weights load from a file with the
class head left new; wrong arguments are one line."""
from __future__ import annotations

import pytest
import torch
import torchvision

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.models.detectors import ARCHS
from trainforge.tasks import task_of

INFO = DataInfo("detection", "image", (3, 64, 64), "float32", 3, ("__background__", "box", "disc"))


def batch(n: int = 2):
    images = torch.rand(n, 3, 64, 64)
    targets = [{"boxes": torch.tensor([[4.0, 6.0, 30.0, 40.0], [33.0, 20.0, 60.0, 50.0]]),
                "labels": torch.tensor([1, 2])} for _ in range(n)]
    return images, targets


@pytest.mark.parametrize("arch", ARCHS)
def test_every_detector_trains_a_step_through_the_task_and_detects(arch):
    torch.manual_seed(0)
    model, spec = build_model(ModelConfig(name="detector", args={"arch": arch, "pretrained": False}), INFO)
    assert spec.shape == (3, 64, 64)
    task = task_of(INFO)
    model.train()
    losses = task.forward(model, batch())
    assert isinstance(losses, dict) and losses and all(v.dim() == 0 for v in losses.values())
    loss = task.training_loss(losses, batch())
    assert torch.isfinite(loss)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.eval()
    with torch.no_grad():
        found = task.forward(model, batch(1))
    assert set(found[0]) >= {"boxes", "scores", "labels"} and found[0]["boxes"].shape[-1] == 4
    assert all(0 < int(label) < INFO.num_classes for label in found[0]["labels"])  # the head is sized to the data's classes


def test_torchvision_weights_load_from_a_file_and_the_class_head_stays_new(tmp_path):
    arch = "fasterrcnn_mobilenet_v3_large_320_fpn"
    torch.manual_seed(1)
    coco = torchvision.models.get_model(arch, weights=None, weights_backbone=None)  # COCO's 91 classes
    torch.save(coco.state_dict(), tmp_path / "coco.pth")
    model, _ = build_model(ModelConfig(name="detector", args={"arch": arch, "pretrained": str(tmp_path / "coco.pth")}),
                           INFO)
    own, saved = model.state_dict(), coco.state_dict()
    body = [k for k in saved if not k.startswith("roi_heads.box_predictor")]
    assert all(torch.equal(own[k], saved[k]) for k in body)
    assert own["roi_heads.box_predictor.cls_score.weight"].shape[0] == 3  # background, box, disc
    assert saved["roi_heads.box_predictor.cls_score.weight"].shape[0] == 91


def test_a_small_detector_with_another_backbone_and_anchors():
    args = {"arch": "fasterrcnn_resnet50_fpn", "backbone": "resnet18", "pretrained": False,
            "anchor_sizes": [8, 16, 32, 64, 128], "options": {"box_batch_size_per_image": 64}}
    model, _ = build_model(ModelConfig(name="detector", args=args), INFO)
    assert sum(p.numel() for p in model.backbone.body.parameters()) < 12e6  # a ResNet-18 body
    assert model.rpn.anchor_generator.sizes == ((8,), (16,), (32,), (64,), (128,))
    assert model.roi_heads.fg_bg_sampler.batch_size_per_image == 64
    assert model.transform.min_size == (64,) and model.transform.max_size == 64  # the data's size: no resize


BAD = [({"arch": "yolo"}, r"model.args.arch: expected one of fasterrcnn_mobilenet_v3_large_fpn"),
       ({"arch": "fasterrcnn_resnet50_fpn", "backbone": "resnet18"}, r"model.args.backbone: .* set model.args."
                                                                     r"pretrained: false"),
       ({"pretrained": False, "anchor_sizes": [8, 16]}, r"model.args.anchor_sizes: .* has 3 feature levels"),
       ({"pretrained": False, "options": {"no_such": 1}}, r"model.args.options: .* does not take one of \['no_such'\]"),
       ({"pretrained": False, "options": {"num_classes": 5}}, r"model.args.options: num_classes set by trainforge"),
       ({"pretrained": 3}, r"model.args.pretrained: true"),
       ({"pretrained": "/no/such/weights.pth"}, r"model.args.pretrained: .*weights.pth")]


@pytest.mark.parametrize("args, message", BAD)
def test_wrong_arguments_are_one_line(args, message):
    with pytest.raises(UserError, match=message):
        build_model(ModelConfig(name="detector", args=args), INFO)


def test_a_detector_needs_detection_data():
    classes = DataInfo("classification", "image", (3, 64, 64), "float32", 3)
    with pytest.raises(UserError, match=r"model.name: detector needs object detection"):
        build_model(ModelConfig(name="detector", args={"pretrained": False}), classes)


def test_a_timm_backbone_under_the_fpn_trains_and_loads_its_own_weights(tmp_path):
    """backbone: timm:<name>: the timm CNN's stride 4-32 maps under torchvision's FPN (Faster R-CNN; RetinaNet takes
    8-32 and adds P6, P7); backbone_weights a state dict file of that timm model fills the body; a model with no
    stride-4 map, or a name timm does not know, is one line."""
    import timm
    from safetensors.torch import save_file

    from trainforge.errors import UserError
    from trainforge.models.detectors import TimmFPN, build_detector

    info = DataInfo("detection", "image", (3, 64, 64), "float32", 3, ("__background__", "box", "disc"))
    torch.manual_seed(0)
    saved = timm.create_model("resnet18", pretrained=False)
    save_file(saved.state_dict(), str(tmp_path / "resnet18.safetensors"))
    model, _ = build_detector(info, arch="fasterrcnn_resnet50_fpn", pretrained=False, backbone="timm:resnet18",
                              backbone_weights=str(tmp_path / "resnet18.safetensors"),
                              anchor_sizes=[8, 16, 32, 64, 128])
    assert isinstance(model.backbone, TimmFPN) and model.backbone.picked == [1, 2, 3, 4]
    assert torch.equal(model.backbone.body.state_dict()["layer1.0.conv1.weight"], saved.state_dict()["layer1.0.conv1.weight"])
    images = torch.rand(2, 3, 64, 64)
    targets = [{"boxes": torch.tensor([[8.0, 8.0, 30.0, 30.0]]), "labels": torch.tensor([1])}] * 2
    losses = model.train()(images, targets)
    sum(losses.values()).backward()
    assert model.backbone.body.conv1.weight.grad is not None and all(torch.isfinite(v) for v in losses.values())
    model.eval()
    with torch.no_grad():
        assert set(model(images)[0]) == {"boxes", "scores", "labels"}

    retina, _ = build_detector(info, arch="retinanet_resnet50_fpn", pretrained=False, backbone="timm:convnext_atto",
                               trainable_backbone_layers=0)
    assert retina.backbone.picked == [1, 2, 3] and not any(p.requires_grad for p in retina.backbone.body.parameters())
    with torch.no_grad():
        assert len(retina.eval()(images)) == 2
    with pytest.raises(UserError, match="no feature map at stride 4"):
        build_detector(info, arch="fasterrcnn_resnet50_fpn", pretrained=False, backbone="timm:vit_tiny_patch16_224")
    with pytest.raises(UserError, match="'resnet_nope' is not a timm model"):
        build_detector(info, arch="fasterrcnn_resnet50_fpn", pretrained=False, backbone="timm:resnet_nope")


def test_a_hostile_or_damaged_timm_backbone_file_is_one_line(tmp_path):
    """backbone_weights is a path the user (or another user's job submission) names: a pickle that would run code is
    refused unread by torch.load(weights_only=True), a truncated file too, each as one line naming the field."""
    import pickle

    from trainforge.errors import UserError
    from trainforge.models.detectors import build_detector

    info = DataInfo("detection", "image", (3, 64, 64), "float32", 3, ("__background__", "box", "disc"))

    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    hostile = tmp_path / "evil.pth"
    hostile.write_bytes(pickle.dumps(Payload()))
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(b"\x10\x00\x00")
    for path, what in ((hostile, "would run code"), (truncated, "damaged or truncated")):
        with pytest.raises(UserError, match=f"model.args.backbone_weights: .* is a .*{what}"):
            build_detector(info, arch="fasterrcnn_resnet50_fpn", pretrained=False, backbone="timm:resnet18",
                           backbone_weights=str(path))
