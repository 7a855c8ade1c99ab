"""Bad compress input: exit 2, one line naming the flag or file, nothing written."""
from __future__ import annotations


import pytest

from trainforge.cli import main

CASES = {
    "prune above 1": (["--prune", "1.5"], "--prune"),
    "negative fine-tuning": (["--prune", "0.5", "--finetune-epochs", "-1"], "--finetune-epochs"),
    "distill without pruning": (["--distill"], "--distill"),
    "unknown quantization": (["--quantize", "int4"], "--quantize: expected one of int8, none"),
    "unknown export": (["--export", "tflite"], "--export: expected one of onnx"),
    "unknown int8 method": (["--int8-method", "gptq"], "unknown int8 method 'gptq'"),
    "zero threads": (["--threads", "0"], "--threads"),
    "negative accuracy tolerance": (["--accuracy-tolerance", "-1"], "--accuracy-tolerance: expected points of accuracy"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_flags(case, digits_run, capsys):
    args, message = CASES[case]
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", str(digits_run), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err and "Traceback" not in err
    assert not (digits_run / "compressed").exists()


def test_missing_checkpoint(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", str(tmp_path / "nope")])
    assert exit_info.value.code == 2
    assert "no such checkpoint or run directory" in capsys.readouterr().err


def test_an_out_dir_with_other_files_is_left_alone(digits_run, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", str(digits_run), "--out", str(out)])
    assert exit_info.value.code == 2
    assert "did not write (notes.txt)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


def test_float8_without_a_gpu_is_a_user_error(digits_run, tmp_path, capsys):
    pytest.importorskip("torchao")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: float8 runs (tests/compression/test_compress_torchao.py)")
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", str(digits_run), "--quantize", "torchao-float8", "--out", str(tmp_path / "o"),
              "--bench-seconds", "0.05"])
    assert exit_info.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
