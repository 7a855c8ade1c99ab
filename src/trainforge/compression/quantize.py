"""int8 with ONNX Runtime: dynamic for Linear-heavy models, static QDQ per-channel for conv-heavy ones.

    method = choose_method(model, example)             # "static" for conv nets, "dynamic" otherwise
    quantize_onnx(fp32_path, int8_path, method, calibration=batches)   # batches: numpy arrays from train

Dynamic quantization stores MatMul/Gemm/Gather weights as int8 and quantizes activations on the fly: no
calibration, fast on Linear-heavy models; on a CNN it turns Conv into ConvInteger, which is slower than
float (docs/gpu-facts.md). Static QDQ quantizes weights per output channel and activations with ranges measured
on calibration batches, so ORT fuses them into int8 convolutions. Large float initializers that neither
method touches (a Transformer's position table, say) are stored as int8 with a DequantizeLinear in front:
the file shrinks and the arithmetic stays float.

Convolutions that read fewer than `StaticInt8.float_conv_channels` (16) channels, in practice the stem on a
grayscale or RGB image, stay float: ORT's int8 convolution is an im2col GEMM whose reduction (C_in x 3 x 3 = 9
for one channel) is too short to pay for itself, while its float convolution has a direct kernel for few input
channels. On a 32x32 grayscale CNN (16/32/64 channels) the int8 stem took 1.4 ms of a 2.3 ms batch of 32,
the float stem 0.2 ms (docs/deploy.md has the figures). Such a stem's ReLU -> MaxPool is reordered to
MaxPool -> ReLU (the same values) so the activations are quantized after the pooling, on a quarter of the
elements; otherwise ORT moves the QuantizeLinear above the MaxPool and runs a slow int8 NCHW MaxPool.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import torch
from torch import nn

from trainforge.compression.artifact import INPUT_NAME, embed_meta
from trainforge.compression.export import slim
from trainforge.errors import UserError
from trainforge.models import is_convolutional
from trainforge.registry import Registry

INT8_METHODS: Registry = Registry("int8 method", "--int8-method")
WEIGHT_ONLY_MIN_ELEMENTS = 1024  # smaller tables (norm scales, biases) are not worth a node
# 7-bit weights. On x86 without AVX512-VNNI, ONNX Runtime's int8 kernels (u8 x s8 pairs summed into int16
# by vpmaddubsw) saturate with full 8-bit weights: a static digits CNN lost 2.2 accuracy points on an AVX2-only
# EPYC and none with reduce_range (same speed). The artifact may be served on any CPU, so always reduce.
REDUCE_RANGE = True


@dataclass(frozen=True)
class StaticInt8:
    """Settings of static quantization; the defaults are the measured best (benchmarks/int8_cnn.py compares them)."""

    per_channel: bool = True  # weights: one scale per output channel (per tensor: same speed, coarser)
    activations: str = "int8"  # int8 | uint8: the same speed on x86 with VNNI; int8 is symmetric around 0
    format: str = "qdq"  # qdq | qoperator (with int8 activations ORT 1.32 ran QOperator 12x slower than fp32)
    float_conv_channels: int = 16  # a Conv reading fewer channels stays float (0: quantize every Conv)


STATIC = StaticInt8()


def choose_method(model: nn.Module, example: Optional[torch.Tensor] = None) -> str:
    """Static QDQ for models whose compute is convolutions, dynamic for the rest (Linear-heavy).

    With an `example` input the multiply-accumulates of the Conv and Linear layers on it decide: a vision
    Transformer (a transformers or timm ViT) has a convolution, its patch embedding, but its compute is in
    Linear layers, where dynamic int8 is both closer to fp32 and smaller. Without one, any Conv2d decides.
    """
    if example is None or not is_convolutional(model):
        return "static" if is_convolutional(model) else "dynamic"
    conv, linear = layer_macs(model, tuple(x[:1] for x in example) if isinstance(example, tuple) else example[:1])
    return "static" if conv >= linear else "dynamic"


def layer_macs(model: nn.Module, example: torch.Tensor) -> tuple[int, int]:
    """(multiply-accumulates in Conv layers, in Linear layers) of one forward pass on `example`."""
    totals = {"conv": 0, "linear": 0}

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if not isinstance(output, torch.Tensor):
            return
        if isinstance(module, nn.modules.conv._ConvNd):
            per_output = module.in_channels // module.groups * math.prod(module.kernel_size)
            totals["conv"] += output.numel() * per_output
        else:
            totals["linear"] += output.numel() * module.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.modules.conv._ConvNd, nn.Linear))]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(*example) if isinstance(example, tuple) else model(example)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return totals["conv"], totals["linear"]


def quantize_onnx(src: Path, dst: Path, method: str, meta: dict[str, Any],
                  calibration: Optional[Iterable[np.ndarray]] = None, static: StaticInt8 = STATIC) -> Path:
    """Write the int8 version of the ONNX file `src` to `dst` by `method` ("dynamic" | "static")."""
    quantize = INT8_METHODS.get(method)
    import onnx  # heavy (onnx): loaded only when quantizing
    from onnxruntime.quantization.shape_inference import quant_pre_process  # heavy (onnxruntime): loaded only when quantizing

    dst.parent.mkdir(parents=True, exist_ok=True)
    prepared = dst.with_name(dst.stem + ".prep.onnx")
    staged = dst.with_name(dst.stem + ".q.onnx")
    try:
        with _quiet():
            # shape inference + graph cleanup; the symbolic pass cannot read dynamo exports' dim names
            quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
            quantize(prepared, staged, calibration, static)
        proto = onnx.load(str(staged))
        weight_only_int8(proto)
        slim(proto)
        embed_meta(proto, meta)
        onnx.save_model(proto, str(dst), save_as_external_data=False)
    finally:
        for tmp in (prepared, staged):
            tmp.unlink(missing_ok=True)
    return dst


@INT8_METHODS.register("dynamic")
def _dynamic(src: Path, dst: Path, calibration: Optional[Iterable[np.ndarray]], static: StaticInt8) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic  # heavy (onnxruntime): loaded only when quantizing

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm", "Gather"],
                     reduce_range=REDUCE_RANGE)


@INT8_METHODS.register("static")
def _static(src: Path, dst: Path, calibration: Optional[Iterable[np.ndarray]], static: StaticInt8) -> None:
    import onnx  # heavy (onnx): loaded only when quantizing
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static  # heavy (onnxruntime): loaded only when quantizing

    if calibration is None:
        raise UserError("--int8-method static needs calibration batches from the train split")
    proto = onnx.load(str(src))
    keep_float = float_stems(proto, static.float_conv_channels)
    if keep_float:
        onnx.save_model(proto, str(src))
    quantize_static(
        str(src), str(dst), _Reader(calibration),
        quant_format=QuantFormat.QDQ if static.format == "qdq" else QuantFormat.QOperator,
        per_channel=static.per_channel,
        activation_type=QuantType.QInt8 if static.activations == "int8" else QuantType.QUInt8,
        weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
        reduce_range=REDUCE_RANGE, nodes_to_exclude=keep_float,
    )


def float_stems(proto: Any, min_channels: int) -> list[str]:
    """Names of the nodes to keep float: each ungrouped Conv reading fewer than `min_channels` channels, and
    the ReLU and MaxPool right after it, which are reordered MaxPool -> ReLU in `proto` (see module doc).

    Unnamed nodes get names (the quantizer excludes nodes by name).
    """
    graph = proto.graph
    for i, node in enumerate(graph.node):
        if not node.name:
            node.name = f"node{i}"
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    def only_consumer(tensor: str, op_type: str) -> Optional[Any]:
        users = consumers.get(tensor, [])
        if len(users) == 1 and users[0].op_type == op_type and tensor not in outputs:
            return users[0]
        return None

    keep: list[str] = []
    for node in list(graph.node):
        if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in shapes:
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        weight = shapes[node.input[1]]
        if group != 1 or len(weight) < 2 or weight[1] >= min_channels:
            continue
        keep.append(node.name)
        relu = only_consumer(node.output[0], "Relu")
        pool = relu and only_consumer(relu.output[0], "MaxPool")
        if pool is not None and len(pool.output) == 1:
            # conv -> relu -> pool -> x  becomes  conv -> pool -> relu -> x: max commutes with max(0, .)
            conv_out, relu_out, pool_out = node.output[0], relu.output[0], pool.output[0]
            pool.input[0], pool.output[0] = conv_out, relu_out
            relu.input[0], relu.output[0] = relu_out, pool_out
            nodes = list(graph.node)
            a, b = nodes.index(relu), nodes.index(pool)
            nodes[a], nodes[b] = nodes[b], nodes[a]  # still topologically sorted: pool now feeds relu
            del graph.node[:]
            graph.node.extend(nodes)
            # relu_out is now the pooled tensor: drop its recorded (unpooled) shape; ORT infers it again
            infos = [v for v in graph.value_info if v.name != relu_out]
            del graph.value_info[:]
            graph.value_info.extend(infos)
            keep += [pool.name, relu.name]
    return keep


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over an iterable of input batches."""

    def __init__(self, batches: Iterable[np.ndarray]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> Optional[dict[str, np.ndarray]]:
        batch = next(self._batches, None)  # an array (a model of one input) or the feeds of several
        return None if batch is None else batch if isinstance(batch, dict) else {INPUT_NAME: batch}

    def __iter__(self):  # the calibrator may iterate instead of calling get_next
        return iter(self.get_next, None)


def weight_only_int8(proto: Any, min_elements: int = WEIGHT_ONLY_MIN_ELEMENTS) -> list[str]:
    """Store each large float32 initializer that is still read as float as int8 + DequantizeLinear.

    Symmetric per-tensor scale max|w|/127, so the round trip error is at most scale/2 per element.
    Returns the names replaced.
    """
    from onnx import TensorProto, helper, numpy_helper  # heavy (onnx): loaded only when quantizing

    dequantized = {n.input[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    replaced: list[str] = []
    new_nodes = []
    keep = []
    for init in proto.graph.initializer:
        if init.data_type != TensorProto.FLOAT or init.name in dequantized:
            keep.append(init)
            continue
        w = numpy_helper.to_array(init)
        if w.size < min_elements:
            keep.append(init)
            continue
        scale = np.float32(max(float(np.abs(w).max()), 1e-12) / 127.0)
        q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
        name = init.name
        keep += [
            numpy_helper.from_array(q, name + "_w8"),
            numpy_helper.from_array(np.array(scale, dtype=np.float32), name + "_w8_scale"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), name + "_w8_zero"),
        ]
        new_nodes.append(helper.make_node("DequantizeLinear", [name + "_w8", name + "_w8_scale", name + "_w8_zero"],
                                          [name], name=name + "_w8_dequantize"))
        replaced.append(name)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(keep)
    nodes = list(proto.graph.node)
    del proto.graph.node[:]
    proto.graph.node.extend(new_nodes + nodes)  # first: the graph stays topologically sorted
    return replaced


@contextlib.contextmanager
def _quiet() -> Any:
    """ORT's quantizer logs every skipped node at WARNING; keep stderr for what the user needs."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)
