"""int8 with ONNX Runtime: dynamic for Linear-heavy models, static QDQ per-channel for conv-heavy ones.

    method = choose_method(model)                      # "static" for conv nets, "dynamic" otherwise
    quantize_onnx(fp32_path, int8_path, method, calibration=batches)   # batches: numpy arrays from train

Dynamic quantization stores MatMul/Gemm/Gather weights as int8 and quantizes activations on the fly: no
calibration, fast on Linear-heavy models; on a CNN it turns Conv into ConvInteger, which is slower than
float (gpu-facts.md). Static QDQ quantizes weights per output channel and activations with ranges measured
on calibration batches, so ORT fuses them into int8 convolutions. Large float initializers that neither
method touches (a Transformer's position table, say) are stored as int8 with a DequantizeLinear in front:
the file shrinks and the arithmetic stays float.
"""
from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
from torch import nn

from trainforge.compression.artifact import INPUT_NAME, embed_meta
from trainforge.compression.export import slim
from trainforge.errors import UserError
from trainforge.registry import Registry

INT8_METHODS: Registry = Registry("int8 method", "--int8-method")
WEIGHT_ONLY_MIN_ELEMENTS = 1024  # smaller tables (norm scales, biases) are not worth a node
# 7-bit weights. On x86 without AVX512-VNNI, ONNX Runtime's int8 kernels (u8 x s8 pairs summed into int16
# by vpmaddubsw) saturate with full 8-bit weights: a static digits CNN lost 2.2 accuracy points on an AVX2-only
# EPYC and none with reduce_range (same speed). The artifact may be served on any CPU, so always reduce.
REDUCE_RANGE = True


def choose_method(model: nn.Module) -> str:
    """Static QDQ for models whose compute is convolutions, dynamic for the rest (Linear-heavy)."""
    from trainforge.models import is_convolutional

    return "static" if is_convolutional(model) else "dynamic"


def quantize_onnx(src: Path, dst: Path, method: str, meta: dict[str, Any],
                  calibration: Optional[Iterable[np.ndarray]] = None) -> Path:
    """Write the int8 version of the ONNX file `src` to `dst` by `method` ("dynamic" | "static")."""
    quantize = INT8_METHODS.get(method)
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    dst.parent.mkdir(parents=True, exist_ok=True)
    prepared = dst.with_name(dst.stem + ".prep.onnx")
    staged = dst.with_name(dst.stem + ".q.onnx")
    try:
        with _quiet():
            # shape inference + graph cleanup; the symbolic pass cannot read dynamo exports' dim names
            quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
            quantize(prepared, staged, calibration)
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
def _dynamic(src: Path, dst: Path, calibration: Optional[Iterable[np.ndarray]]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm", "Gather"],
                     reduce_range=REDUCE_RANGE)


@INT8_METHODS.register("static")
def _static(src: Path, dst: Path, calibration: Optional[Iterable[np.ndarray]]) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if calibration is None:
        raise UserError("--int8-method static needs calibration batches from the train split")
    quantize_static(
        str(src), str(dst), _Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
        reduce_range=REDUCE_RANGE,
    )


class _Reader:
    """onnxruntime's CalibrationDataReader protocol over an iterable of input batches."""

    def __init__(self, batches: Iterable[np.ndarray]) -> None:
        self._batches = iter(batches)

    def get_next(self) -> Optional[dict[str, np.ndarray]]:
        batch = next(self._batches, None)
        return None if batch is None else {INPUT_NAME: batch}

    def __iter__(self):  # the calibrator may iterate instead of calling get_next
        return iter(self.get_next, None)


def weight_only_int8(proto: Any, min_elements: int = WEIGHT_ONLY_MIN_ELEMENTS) -> list[str]:
    """Store each large float32 initializer that is still read as float as int8 + DequantizeLinear.

    Symmetric per-tensor scale max|w|/127, so the round trip error is at most scale/2 per element.
    Returns the names replaced.
    """
    from onnx import TensorProto, helper, numpy_helper

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
