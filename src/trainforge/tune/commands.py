"""Command-line entry points of this stage; registered on the main `trainforge` app by cli.py.

Keep module-level imports light (typer, rich, trainforge.console): heavy libraries load inside commands.
"""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the `trainforge` app."""
