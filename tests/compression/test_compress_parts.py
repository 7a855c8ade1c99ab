"""The compression stages one by one: pruning, resizing, distillation loss, export, int8 storage."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

from trainforge.compression.artifact import INPUT_NAME, META_KEY, OUTPUT_NAME, artifact_meta
from trainforge.tasks import TASKS
from trainforge.compression.export import export_onnx
from trainforge.compression.prune import prune_model
from trainforge.compression.quantize import StaticInt8, choose_method, float_stems, quantize_onnx, weight_only_int8
from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model
from trainforge.models.resize import resize_to_weights

IMAGE = DataInfo(task="classification", modality="image", input_shape=(3, 16, 16), input_dtype="float32",
                 num_classes=5, class_names=tuple("abcde"))
TEXT = DataInfo(task="classification", modality="text", input_shape=(24,), input_dtype="int64", num_classes=3,
                class_names=("x", "y", "z"), vocab_size=100, seq_len=24)
LM = DataInfo(task="lm", modality="text", input_shape=(16,), input_dtype="int64", num_classes=0, vocab_size=64, seq_len=16)

CASES = {
    "cnn": (ModelConfig(name="cnn", args={"channels": [16, 32]}), IMAGE),
    "resnet": (ModelConfig(name="resnet", args={"depth": 8}), IMAGE),
    "text_transformer": (ModelConfig(name="text_transformer", args={"dim": 32, "depth": 2, "heads": 4}), TEXT),
    "gpt": (ModelConfig(name="gpt", args={"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16}), LM),
}


def example_for(info: DataInfo, n: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if info.modality == "image":
        return torch.randn(n, *info.input_shape, generator=g)
    return torch.randint(1, info.vocab_size, (n, *info.input_shape), generator=g)


@pytest.mark.parametrize("name", sorted(CASES))
def test_pruning_removes_channels_and_keeps_the_interface(name):
    cfg, info = CASES[name]
    model, _ = build_model(cfg, info)
    x = example_for(info)
    before = model.eval()(x)
    result = prune_model(model, x, 0.5)
    assert result.params_after < result.params_before
    assert result.flops_after < result.flops_before
    assert sum(p.numel() for p in result.model.parameters()) == result.params_after
    assert result.model.eval()(x).shape == before.shape
    assert torch.equal(model(x), before), "the original model must be left as it was"


@pytest.mark.parametrize("name", ["cnn", "resnet", "text_transformer"])
def test_a_pruned_model_is_rebuilt_from_its_weights_alone(name):
    cfg, info = CASES[name]
    model, _ = build_model(cfg, info)
    x = example_for(info)
    pruned = prune_model(model, x, 0.5).model.eval()
    weights = pruned.state_dict()
    fresh, _ = build_model(cfg, info)
    resize_to_weights(fresh, weights)
    fresh.load_state_dict(weights)
    assert torch.equal(fresh.eval()(x), pruned(x))


def test_resizing_refuses_weights_of_another_architecture():
    cfg, info = CASES["cnn"]
    model, _ = build_model(cfg, info)
    weights = {k: v.flatten() if v.dim() == 4 else v for k, v in model.state_dict().items()}
    with pytest.raises(UserError, match="another architecture"):
        resize_to_weights(model, weights)


def test_pruning_ratio_outside_0_1_is_a_user_error():
    cfg, info = CASES["cnn"]
    model, _ = build_model(cfg, info)
    with pytest.raises(UserError, match="--prune"):
        prune_model(model, example_for(info), 1.0)


def test_distillation_loss_terms():
    """Task.distill_loss: classification's rows are samples, a language model's positions."""
    task = TASKS.get("classification")
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    batch = (torch.zeros(8, 1), y)
    # alpha 0: plain cross-entropy; alpha 1 with student == teacher: zero
    assert torch.allclose(task.distill_loss(s, t, batch, temperature=3.0, alpha=0.0), F.cross_entropy(s, y))
    assert task.distill_loss(t, t, batch, temperature=3.0, alpha=1.0).abs() < 1e-6
    # the soft term is KL(teacher || student) at temperature T, scaled by T^2
    T = 2.0
    kl = (F.softmax(t / T, -1) * (F.log_softmax(t / T, -1) - F.log_softmax(s / T, -1))).sum(-1).mean() * T * T
    assert torch.allclose(task.distill_loss(s, t, batch, temperature=T, alpha=1.0), kl, atol=1e-6)
    # language models: (batch, time, vocab) logits with (batch, time) targets
    s3, t3 = torch.randn(2, 4, 7, generator=g), torch.randn(2, 4, 7, generator=g)
    y3 = torch.randint(0, 7, (2, 4), generator=g)
    lm = TASKS.get("lm")
    assert lm.distill_loss(s3, t3, (torch.zeros(2, 4), y3), temperature=2.0, alpha=0.5).isfinite()


def test_a_segmenters_distillation_is_over_the_class_dimension_of_each_pixel():
    """Issue 51, item 2: (N, C, H, W) logits are compared pixel by pixel over C (the old reshape took the width)."""
    task = TASKS.get("segmentation")
    g = torch.Generator().manual_seed(2)
    s, t = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 4, 5, generator=g)
    y = torch.randint(0, 3, (2, 4, 5), generator=g)
    T = 3.0
    direct = torch.stack([  # per pixel, KL(softmax(t/T) || softmax(s/T)) over the 3 classes, then the mean of pixels
        (F.softmax(t[n, :, i, j] / T, 0) * (F.log_softmax(t[n, :, i, j] / T, 0) - F.log_softmax(s[n, :, i, j] / T, 0)))
        .sum() for n in range(2) for i in range(4) for j in range(5)]).mean() * T * T
    soft = task.distill_loss(s, t, (torch.zeros(2, 3, 4, 5), y), temperature=T, alpha=1.0)
    assert torch.allclose(soft, direct, atol=1e-6)
    hard = task.distill_loss(s, t, (torch.zeros(2, 3, 4, 5), y), temperature=T, alpha=0.0)
    assert torch.allclose(hard, task.training_loss(s, (None, y)), atol=1e-6)
    assert TASKS.get("detection").distill_refusal and "no distillation" in TASKS.get("detection").distill_refusal
    assert task.distill_refusal is None and TASKS.get("classification").distill_refusal is None


def test_int8_method_follows_the_model_type():
    assert choose_method(build_model(*CASES["cnn"])[0]) == "static"
    assert choose_method(build_model(*CASES["resnet"])[0]) == "static"
    assert choose_method(build_model(*CASES["text_transformer"])[0]) == "dynamic"
    # with an example, the multiply-accumulates decide: a ViT's one Conv (its patch embedding) does not make it a CNN
    for name, method in (("cnn", "static"), ("resnet", "static"), ("text_transformer", "dynamic")):
        cfg, info = CASES[name]
        assert choose_method(build_model(cfg, info)[0], example_for(info)) == method
    vit = build_model(ModelConfig(name="vit", args={"patch_size": 4, "dim": 32, "depth": 2, "heads": 2}), IMAGE)[0]
    assert choose_method(vit) == "static" and choose_method(vit, example_for(IMAGE)) == "dynamic"


class DataDependent(torch.nn.Module):
    """A branch on a value: torch.export refuses it, the TorchScript tracer records the branch taken."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > -1e9:
            return self.head(x)
        return -self.head(x)


class Unexportable(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigh(x @ x.transpose(-1, -2))[0]


def test_export_falls_back_to_the_tracer_and_a_model_neither_takes_is_one_line(tmp_path, capfd):
    model = DataDependent().eval()
    path = export_onnx(model, torch.randn(2, 4), tmp_path / "fallback.onnx", {"variant": "fp32"})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.randn(5, 4)  # another batch size: the batch stays dynamic
    np.testing.assert_allclose(session.run(None, {INPUT_NAME: x.numpy()})[0], model(x).detach().numpy(), atol=1e-6)
    with pytest.raises(UserError, match=r"ONNX export of Unexportable failed with torch's exporters "
                                        r"\(dynamo: .*linalg_eigh.*; TorchScript: .*linalg_eigh") as exc:
        export_onnx(Unexportable(), torch.randn(2, 3, 3), tmp_path / "never.onnx", {})
    assert "\n" not in str(exc.value) and sorted(p.name for p in tmp_path.iterdir()) == ["fallback.onnx"]
    assert "graph" not in capfd.readouterr().out  # the tracer's C++ log stays off stdout (compress --json)


def test_a_model_that_names_its_exporters_is_given_only_those(tmp_path):
    """A family that knows torch.export cannot take it (torchvision's detectors: minutes to fail) goes to the tracer
    straight away: the error of a model neither takes names the one exporter tried."""
    from trainforge.compression.export import exporters_of
    from trainforge.data.base import DataInfo
    from trainforge.models.detectors import build_detector
    from trainforge.tasks.exporting import OneImageDetections

    model = Unexportable()
    model.onnx_exporters = ("torchscript",)
    with pytest.raises(UserError, match=r"failed with torch's exporters \(TorchScript: .*linalg_eigh[^;]*\)") as exc:
        export_onnx(model, torch.randn(2, 3, 3), tmp_path / "never.onnx", {})
    assert "dynamo" not in str(exc.value)
    assert exporters_of(Unexportable()) == ("dynamo", "torchscript")
    info = DataInfo("detection", "image", (3, 32, 32), "float32", 3, class_names=("background", "box", "disc"))
    with torch.device("meta"):
        for arch in ("fasterrcnn_mobilenet_v3_large_fpn", "retinanet_resnet50_fpn", "fcos_resnet50_fpn", "ssdlite320_mobilenet_v3_large"):
            detector, _ = build_detector(info, arch=arch, pretrained=False)
            assert exporters_of(OneImageDetections(detector)) == ("torchscript",), arch


@pytest.mark.parametrize("name", ["cnn", "text_transformer"])
def test_export_has_a_dynamic_batch_metadata_and_one_file(name, tmp_path):
    cfg, info = CASES[name]
    model, _ = build_model(cfg, info)
    model.eval()
    x = example_for(info, 32)
    path = export_onnx(model, x, tmp_path / "m.onnx", artifact_meta("fp32", info, {"modality": info.modality}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"], "weights inside the file, no temp left"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [INPUT_NAME]
    assert [o.name for o in session.get_outputs()] == [OUTPUT_NAME]
    meta = session.get_modelmeta().custom_metadata_map[META_KEY]
    assert '"variant": "fp32"' in meta and '"input_dtype"' in meta
    for batch in (1, 7, 32):  # exported at batch 2; other sizes must work
        got = session.run(None, {INPUT_NAME: x[:batch].numpy()})[0]
        assert np.abs(got - model(x[:batch]).detach().numpy()).max() < 1e-4
    proto = onnx.load(str(path))
    assert all(not n.metadata_props for n in proto.graph.node), "exporter debug records are dropped"


def test_weight_only_int8_round_trip_error_is_half_a_step():
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 32])],
        [numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert weight_only_int8(proto) == ["w"]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": np.zeros_like(w)})[0]
    step = np.abs(w).max() / 127
    assert np.abs(got - w).max() <= step / 2 + 1e-7
    assert np.abs(got - w).max() > 0, "the table really is stored as int8"


def test_static_int8_without_calibration_is_a_user_error(tmp_path):
    cfg, info = CASES["cnn"]
    model, _ = build_model(cfg, info)
    path = export_onnx(model, example_for(info), tmp_path / "m.onnx", artifact_meta("fp32", info, {}))
    with pytest.raises(UserError, match="calibration"):
        quantize_onnx(path, tmp_path / "q.onnx", "static", artifact_meta("int8", info, {}), calibration=None)
    assert not list(tmp_path.glob("q*")), "no partial output left behind"


def ops_after_ort(path, tmp_path) -> list[str]:
    """The op types onnxruntime runs for `path` after its graph optimizations."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]


def test_the_stem_reorder_is_exact_and_keeps_only_few_channel_convs_float(tmp_path):
    cfg, info = CASES["cnn"]  # 3 input channels, then 16 and 32
    model, _ = build_model(cfg, info)
    x = example_for(info, 8)
    path = export_onnx(model.eval(), x, tmp_path / "m.onnx", artifact_meta("fp32", info, {}))
    proto = onnx.load(str(path))
    keep = float_stems(proto, min_channels=16)
    ops = {n.name: n.op_type for n in proto.graph.node}
    assert [ops[name] for name in keep] == ["Conv", "MaxPool", "Relu"], "the stem only; the 16-channel conv is int8"
    assert [n.op_type for n in proto.graph.node][:3] == ["Conv", "MaxPool", "Relu"]
    reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {INPUT_NAME: x.numpy()})[0]
    reordered = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.array_equal(reordered.run(None, {INPUT_NAME: x.numpy()})[0], reference), "max and ReLU commute exactly"
    assert float_stems(onnx.load(str(path)), min_channels=0) == []


def test_static_int8_keeps_the_stem_float_and_quantizes_after_its_pooling(tmp_path):
    """A 1-3 channel stem as an int8 im2col GEMM was most of a small CNN's int8 time (issue 12); and unless ReLU and
    MaxPool are swapped, ORT moves the QuantizeLinear above the MaxPool and pools in a slow int8 NCHW kernel."""
    cfg, info = CASES["cnn"]
    model, _ = build_model(cfg, info)
    x = example_for(info, 64)
    path = export_onnx(model.eval(), x, tmp_path / "m.onnx", artifact_meta("fp32", info, {}))
    batches = [x[i:i + 16].numpy() for i in range(0, 64, 16)]
    new = quantize_onnx(path, tmp_path / "new.onnx", "static", artifact_meta("int8", info, {}), calibration=batches)
    old = quantize_onnx(path, tmp_path / "old.onnx", "static", artifact_meta("int8", info, {}), calibration=batches,
                        static=StaticInt8(float_conv_channels=0))
    optimized = ops_after_ort(new, tmp_path)
    assert optimized.index("QuantizeLinear") > optimized.index("MaxPool"), optimized  # float conv + pool first
    assert optimized.count("QLinearConv") == 1 and "Conv" in optimized
    assert ops_after_ort(old, tmp_path).count("QLinearConv") == 2, "the previous setting quantized every conv"
    want = model(x).detach().numpy()
    got = ort.InferenceSession(str(new), providers=["CPUExecutionProvider"]).run(None, {INPUT_NAME: x.numpy()})[0]
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()
