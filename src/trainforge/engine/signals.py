"""SIGTERM/SIGINT during training: finish the current step, save a checkpoint, exit 0."""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator


class StopFlag:
    def __init__(self) -> None:
        self.signal_name: str | None = None

    def __bool__(self) -> bool:
        return self.signal_name is not None


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopFlag]:
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame) -> None:
        if flag:  # a second signal: the user insists, stop now
            raise KeyboardInterrupt
        flag.signal_name = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
