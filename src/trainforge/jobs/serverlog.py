"""The server's own log: what `trainforge server` (and each submission's check) writes to stderr.

    with log_to(sys.stderr):         # `trainforge server` while it serves; a check's child process while it checks
        ...

Its lines carry what submitters control (a job's name, the last line of a job's output, the full error of a
refused submission, which may quote its data), so every control or invisible character in them is written as
its escape (an ESC as \\x1b, a newline inside a message as \\x0a): one event is one line, and nothing in it
acts on the operator's terminal. Tracebacks keep their own newlines.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional, TextIO

from trainforge.errors import printable

FORMAT = "%(asctime)s %(message)s"
DATE_FORMAT = "%H:%M:%S"


class PrintableFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei) -> str:  # noqa: ANN001 - logging's signature
        return printable(super().formatException(ei), keep="\n")

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep="\n")


@contextlib.contextmanager
def log_to(stream: Optional[TextIO] = None, level: int = logging.INFO) -> Iterator[logging.Handler]:
    """Within the block, log records of `level` and above go to `stream` (stderr by default) through
    PrintableFormatter; afterwards the root logger is as it was."""
    root = logging.getLogger()
    before = root.level
    handler = logging.StreamHandler(stream)
    handler.setFormatter(PrintableFormatter(FORMAT, DATE_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(before)
