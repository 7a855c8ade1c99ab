"""torchao weight quantization of Linear layers: int8 runs on the CPU here, float8 needs a CUDA GPU."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from trainforge.cli import main

pytest.importorskip("torchao")
pytestmark = pytest.mark.slow


def run_compress(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", *args, "--json"])
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err
    return json.loads(captured.out)


def test_torchao_int8_variant_on_the_cpu(text_run, tmp_path, capsys):
    run = tmp_path / "text"
    shutil.copytree(text_run, run)
    doc = run_compress(capsys, str(run), "--quantize", "torchao-int8", "--device", "cpu", "--bench-seconds", "0.1")
    fp32, ao = doc["variants"]
    assert ao["name"] == "torchao-int8" and ao["runtime"] == "torch-cpu"
    assert ao["accuracy"] >= fp32["accuracy"] - 0.01
    assert 0 < ao["max_abs_diff"] < 0.5, "weights really changed, outputs stay close"
    state = torch.load(ao["path"], weights_only=False)
    assert any(type(t).__name__ != "Tensor" for t in state.values()), "Linear weights are torchao int8 tensors"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["torchao-int8", "torchao-float8"])
def test_torchao_variants_on_cuda(kind, text_run, tmp_path, capsys):
    if kind == "torchao-float8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9+")
    run = tmp_path / "text"
    shutil.copytree(text_run, run)
    doc = run_compress(capsys, str(run), "--quantize", kind, "--bench-seconds", "0.2")
    fp32, ao = doc["variants"]
    assert ao["runtime"] == "torch-cuda"
    assert ao["accuracy"] >= fp32["accuracy"] - 0.01
