"""Command-line entry points of this stage; registered on the main `trainforge` app by cli.py.

Keep module-level imports light (typer, rich, trainforge.console): heavy libraries load inside commands.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from rich.text import Text

from trainforge.compression.compress_cmd import compress_command

from trainforge.console import out, print_json


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the `trainforge` app."""
    app.command("compress")(compress_command)
    app.command("predict")(_predict_command)


def _predict_command(
    artifact: Path = typer.Argument(..., metavar="ARTIFACT", help="An .onnx file from `trainforge compress`, or its output folder "
                                    "(serves the variant compress recommended: the fastest at batch 32 within the accuracy tolerance); "
                                    "or a causal LM's final/hf folder (greedy answers, one per input line)."),
    inputs: Optional[List[str]] = typer.Argument(None, metavar="INPUT", help="Image files; text files (one input "
                                                 "per line) or - for stdin; CSV files with the feature columns; "
                                                 ".npz files with an array per input name (any model), .npy files."),
    variant: Optional[str] = typer.Option(None, "--variant", metavar="NAME", help="Serve this variant of the folder "
                                          "(fp32, pruned, int8, pruned+int8) instead of the recommended one."),
    top_k: int = typer.Option(3, "--top-k", help="How many of the most likely classes to report per input."),
    batch_size: int = typer.Option(32, "--batch-size", help="Inputs per onnxruntime call."),
    threads: Optional[int] = typer.Option(None, "--threads", help="onnxruntime intra-op threads (default: all cores)."),
    imports: Optional[List[str]] = typer.Option(None, "--import", metavar="MODULE", help="Import this module "
                                                "first: your own code that registers the model's task (repeatable)."),
    images: Optional[Path] = typer.Option(None, "--images", metavar="DIR", help="Write a picture of each "
                                          "prediction where the model's task draws one (a detector's boxes on its "
                                          "image) into DIR, a new or empty folder."),
    as_json: bool = typer.Option(False, "--json", help="Print exactly one JSON document."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the SHA-256 check of the .onnx file against "
                                   "its folder's manifest.json (e.g. an artifact exported before manifests existed)."),
) -> None:
    """Classify inputs with an exported ONNX artifact (onnxruntime + numpy only; torch is not imported), or answer
    each line of text INPUTs with a causal LM folder (a run's final/hf; torch and transformers)."""
    from trainforge.compression.predict import predict  # numpy + onnxruntime: the CLI starts fast without them

    result = predict(artifact, inputs or [], top_k=top_k, batch_size=batch_size, threads=threads, verify=not no_verify,
                     variant=variant, imports=imports or (), images=images)
    if as_json:
        print_json(result)
        return
    if result["variant"] == "hf":  # a causal LM folder: its greedy answers
        table = Table(title=Text(f"{result['artifact']} (greedy{', chat template' if result['chat'] else ''})"))
        table.add_column("input")
        table.add_column("answer")
        for p in result["predictions"]:
            table.add_row(Text(p["input"]), Text(p["text"]))
        out.print(table)
        return
    why = {"recommended": ", recommended by compress", "--variant": f", chosen with --variant; compress recommends "
           f"{result['recommended']}"}.get(result["chosen_by"], "")
    from trainforge.tasks import TASKS

    columns = TASKS.get(result["task"]).prediction_columns
    columns += ("image",) if any("image" in p for p in result["predictions"]) else ()
    table = Table(title=Text(f"{result['artifact']} ({result['variant']}{why})"))
    table.add_column("input")
    for column in columns:
        table.add_column(column, justify="right" if column in NUMBERS else "left")
    for p in result["predictions"]:  # Text(): a file name or a text line is shown as is, never as rich markup
        table.add_row(Text(p["input"]), *(cell(p.get(column)) for column in columns))
    out.print(table)


NUMBERS = ("probability", "score")


def cell(value: object) -> Text:
    """One table cell: a float to 4 decimals, a list or dict as compact JSON, anything else as text."""
    import json

    if isinstance(value, float):
        return Text(f"{value:.4f}")
    if isinstance(value, (list, dict)):
        return Text(json.dumps(value, separators=(",", ":")))
    return Text(str(value))
