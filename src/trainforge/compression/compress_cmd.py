"""`trainforge compress CHECKPOINT ...`: the command-line face of `trainforge.compression.pipeline.compress`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from trainforge.compression.options import CompressOptions
from trainforge.compression.render import recommendation_line, rich_table

from trainforge.console import err, out, print_json
from trainforge.errors import UserError

OBSERVER = "observer"  # the key of the command line's context object (cli.main) that holds a run observer


def compress_command(
    ctx: typer.Context,
    checkpoint: Path = typer.Argument(..., help="A run directory, its final/, or a checkpoints/step-* directory."),
    prune: float = typer.Option(0.0, "--prune", help="Fraction of channels to remove (structured), e.g. 0.5; 0: no pruning."),
    finetune_epochs: int = typer.Option(3, "--finetune-epochs", help="Epochs of fine-tuning after pruning (0: none)."),
    distill: bool = typer.Option(False, "--distill", help="Fine-tune with knowledge distillation from the unpruned model."),
    temperature: float = typer.Option(4.0, "--temperature", help="Distillation temperature T (loss x T^2)."),
    alpha: float = typer.Option(0.5, "--alpha", help="Weight of the distillation term against cross-entropy."),
    quantize: str = typer.Option("int8", "--quantize", help="int8 (ONNX Runtime) | none | torchao-int8 | torchao-float8."),
    int8_method: str = typer.Option("auto", "--int8-method", help="auto (static for conv nets, dynamic otherwise) | static | dynamic."),
    export: str = typer.Option("onnx", "--export", help="Artifact format: onnx."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Output directory (default RUN/compressed; must be new or empty)."),
    threads: int = typer.Option(1, "--threads", help="onnxruntime threads while timing (fixed, so runs compare)."),
    bench_s: float = typer.Option(1.0, "--bench-seconds", help="Timing budget per variant and batch size."),
    calibration_samples: int = typer.Option(256, "--calibration-samples", help="Train-split samples for static int8."),
    device: Optional[str] = typer.Option(None, "--device", help="Device for torchao variants (default cuda if present)."),
    accuracy_tolerance: float = typer.Option(1.0, "--accuracy-tolerance", help="Points of the task's quality (accuracy, "
                                             "mAP@.5, mIoU; perplexity: percent) a variant may lose against fp32 and still be recommended."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON document."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the SHA-256 check of CHECKPOINT's files against "
                                   "their manifest.json (e.g. a final/ written before manifests existed)."),
) -> None:
    """Shrink a trained model for deployment: prune + fine-tune, int8, ONNX export; a before/after table."""
    options = CompressOptions(
        prune=prune, finetune_epochs=finetune_epochs, distill=distill, temperature=temperature, alpha=alpha,
        quantize=quantize, int8_method=int8_method, export=export, threads=threads, bench_s=bench_s,
        calibration_samples=calibration_samples, device=device, progress=not as_json,
        verify=not no_verify, accuracy_tolerance_pt=accuracy_tolerance,
    )
    options.check()  # the options, then the path: both said before torch loads
    if not checkpoint.exists():
        raise UserError(f"{checkpoint}: no such checkpoint or run directory")
    from trainforge.compression.pipeline import compress  # heavy (torch): the CLI starts fast without it

    # each message one line (soft_wrap: never broken at the terminal's width), shown as written (no markup)
    # the run's observer (log.mlflow's tracking), composed by the entry point that started the command (cli.main)
    observer = (ctx.obj or {}).get(OBSERVER) if isinstance(ctx.obj, dict) else None
    doc = compress(checkpoint, out_dir, options,
                   log=lambda msg: err.print(f"[dim]{escape(msg)}[/dim]", highlight=False, soft_wrap=True),
                   observer=observer)
    if as_json:
        print_json(doc)
        return
    out.print(rich_table(doc))
    out.print(recommendation_line(doc), markup=False, highlight=False)
    out.print(f"artifacts: {doc['out']}" + (f"\nreport: {doc['report']}" if doc.get("report") else ""))
