"""The planner's own step runs at the precision training would resolve on the recipe's device (issue 27): `auto` is
fp32 on a CPU run, 16-bit on a GPU one, as `engine.precision.resolve_precision` decides for both."""
from __future__ import annotations

import trainforge

TINY = ["model.name=mlp", "model.args={hidden: [16]}", "train.global_batch_size=8", "train.micro_batch_size=8",
        "train.max_steps=5", "data.augment.rotation_deg=0", "data.augment.crop_scale=null"]


def test_auto_precision_is_fp32_for_a_cpu_run_and_16_bit_for_a_gpu_run():
    def own(*extra: str) -> str:
        cfg = trainforge.load_config("digits_cnn", [*TINY, *extra])
        return trainforge.plan(cfg, gpus=["h100-sxm"], num_gpus=[1])["simulation"]["precision"]

    assert own("train.device=cpu", "train.precision=auto") == "fp32"
    assert own("train.device=auto", "train.precision=auto") == "bf16"
    assert own("train.device=cpu", "train.precision=bf16") == "bf16"  # asked for explicitly: what the CPU runs too
