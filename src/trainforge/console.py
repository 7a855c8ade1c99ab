"""Where the command line writes: results to stdout, progress, logs and errors to stderr."""
from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

from trainforge.metrics_file import json_safe

out = Console()  # stdout: results
err = Console(stderr=True)  # stderr: progress, logs, errors


def print_json(doc: Any) -> None:
    """Exactly one JSON document on stdout (numbers that JSON lacks, like NaN, become null)."""
    sys.stdout.write(json.dumps(json_safe(doc), indent=1) + "\n")
