"""The run report: `write_report(run_dir)` writes run_dir/report.html (see report/html.py)."""
from __future__ import annotations

from trainforge.report.html import write_report

__all__ = ["write_report"]
