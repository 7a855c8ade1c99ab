"""The live progress bar on stderr: epoch, step, loss, lr, samples/s and ETA."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.markup import escape

from trainforge.data.summary import DataSummary
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

console = Console(stderr=True)


def announce_data(summary: DataSummary) -> None:
    """The data summary line, then each warning in yellow (they quote label values: escaped)."""
    console.print(escape(summary.line), highlight=False, soft_wrap=True)
    for warning in summary.warnings:
        console.print(f"[yellow]warning: {escape(warning)}[/yellow]", highlight=False, soft_wrap=True)
    for note in summary.notes:
        announce_line(note)


def announce_line(line: str) -> None:
    """One plain line on the console (nothing for "")."""
    if line:
        console.print(escape(line), highlight=False, soft_wrap=True)


class TrainProgress:
    def __init__(self, total_steps: int, start_step: int, enabled: bool, speaks: bool = True) -> None:
        self.enabled = enabled
        self.speaks = speaks  # False on every rank but 0: one voice for the whole group
        self._progress: Optional[Progress] = None
        if not enabled:
            return
        self._progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"),
            BarColumn(bar_width=16),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]} lr {task.fields[lr]} {task.fields[sps]} samples/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(compact=True),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task(
            "train", total=total_steps, completed=start_step, epoch="-", loss="-", lr="-", sps="-"
        )
        self._progress.start()

    def update(self, step: int, epoch: int, loss: float, lr: float, samples_per_s: float) -> None:
        if self._progress is None:
            return
        self._progress.update(
            self._task, completed=step, epoch=epoch, loss=f"{loss:.4f}", lr=f"{lr:.2e}", sps=f"{samples_per_s:,.0f}"
        )

    def log(self, message: str) -> None:
        if not self.speaks:
            return
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            console.print(message)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
