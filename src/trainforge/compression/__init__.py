"""Compression and deployment: structured pruning, distillation, int8 quantization, ONNX export, benchmarks, predict."""
