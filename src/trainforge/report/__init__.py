"""Reports on runs: `write_report(run_dir)` writes run_dir/report.html (report/html.py); `runs list` and
`runs compare` read many runs (report/runs.py, report/compare.py).

`write_report` loads on first use (matplotlib): `trainforge.report.runs`, which the command line imports, stays
light."""
from __future__ import annotations

from typing import Any

__all__ = ["write_report"]


def __getattr__(name: str) -> Any:
    if name != "write_report":
        raise AttributeError(f"module 'trainforge.report' has no attribute {name!r}")
    from trainforge.report.html import write_report  # heavy (matplotlib): only the report needs it

    globals()[name] = write_report
    return write_report
