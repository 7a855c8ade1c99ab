"""The live progress bar on stderr: epoch, step, loss, lr, samples/s and ETA."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

console = Console(stderr=True)


class TrainProgress:
    def __init__(self, total_steps: int, start_step: int, enabled: bool) -> None:
        self.enabled = enabled
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
        if self._progress is not None:
            self._progress.console.print(message)
        else:
            console.print(message)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
