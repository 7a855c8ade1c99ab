"""`trainforge compress`'s options and their checks: light (no torch, no onnx), so a meaningless option is answered
before anything heavy loads. `compression.pipeline.compress` takes a CompressOptions."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from trainforge.compression.recommend import ACCURACY_TOLERANCE_PT
from trainforge.config import MAX_EPOCHS
from trainforge.errors import UserError

QUANTIZE = ("int8", "none", "torchao-int8", "torchao-float8")
EXPORTS = ("onnx",)
MAX_THREADS = 1024  # onnxruntime threads while timing
MAX_BENCH_S = 3600.0  # timing budget per variant and batch size: seconds give stable numbers, an hour is plenty
MAX_CALIBRATION_SAMPLES = 1_000_000
INT8_METHOD_NAMES = ("auto", "dynamic", "static")  # compression.quantize.INT8_METHODS, and auto


@dataclass
class CompressOptions:
    prune: float = 0.0  # fraction of each prunable width to remove; 0 = no pruning
    finetune_epochs: int = 3  # after pruning; 0 = none
    finetune_lr_scale: float = 0.5  # fine-tuning peak LR = the recipe's optim.lr x this
    distill: bool = False
    temperature: float = 4.0
    alpha: float = 0.5  # weight of the distillation term
    quantize: str = "int8"
    int8_method: str = "auto"  # auto | dynamic | static
    export: str = "onnx"
    threads: int = 1  # onnxruntime intra-op threads while timing
    calibration_samples: int = 256  # train-split samples for static int8
    bench_s: float = 1.0  # timing budget per variant and batch size
    device: Optional[str] = None  # torchao variants: cuda when present, else cpu
    progress: bool = True
    verify: bool = True  # check CHECKPOINT's files against their SHA-256 manifest (--no-verify: False)
    accuracy_tolerance_pt: float = ACCURACY_TOLERANCE_PT  # a variant losing more is never recommended

    def check(self) -> None:
        if not 0.0 <= self.prune < 1.0:
            raise UserError(f"--prune: expected a fraction in [0, 1) of channels to remove (e.g. 0.5), got {self.prune}")
        if not 0 <= self.finetune_epochs <= MAX_EPOCHS:
            raise UserError(f"--finetune-epochs: expected 0 to {MAX_EPOCHS}, got {self.finetune_epochs}")
        if self.distill and (self.prune == 0.0 or self.finetune_epochs == 0):
            raise UserError("--distill trains the pruned model from the original: add --prune R and --finetune-epochs E > 0")
        if self.quantize not in QUANTIZE:
            raise UserError(f"--quantize: expected one of {', '.join(QUANTIZE)}, got {self.quantize!r}")
        if self.export not in EXPORTS:
            raise UserError(f"--export: expected one of {', '.join(EXPORTS)}, got {self.export!r}")
        if self.int8_method not in INT8_METHOD_NAMES:  # worded as the registry's own lookup error
            raise UserError(f"--int8-method: unknown int8 method {self.int8_method!r}; choose one of: "
                            f"{', '.join(INT8_METHOD_NAMES)}")
        if not 1 <= self.threads <= MAX_THREADS:
            raise UserError(f"--threads: expected 1 to {MAX_THREADS}, got {self.threads}")
        if not (math.isfinite(self.temperature) and self.temperature > 0) or not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"--temperature must be a finite number > 0 and --alpha in [0, 1], got {self.temperature} "
                            f"and {self.alpha}")
        if not (math.isfinite(self.bench_s) and 0 < self.bench_s <= MAX_BENCH_S):  # -1 or nan: no timing at all
            raise UserError(f"--bench-seconds: expected seconds in (0, {MAX_BENCH_S:.0f}] per variant and batch size "
                            f"(e.g. 1.0), got {self.bench_s}")
        if not 1 <= self.calibration_samples <= MAX_CALIBRATION_SAMPLES:
            raise UserError(f"--calibration-samples: expected 1 to {MAX_CALIBRATION_SAMPLES} train-split samples, got "
                            f"{self.calibration_samples}")
        if not 0.0 <= self.accuracy_tolerance_pt <= 100.0:
            raise UserError(f"--accuracy-tolerance: expected points of accuracy in [0, 100] (e.g. 1.0), "
                            f"got {self.accuracy_tolerance_pt}")
