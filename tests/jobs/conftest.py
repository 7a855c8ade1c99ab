"""Fixtures of the job-queue tests."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_root(tmp_path) -> Path:
    """An empty folder the server may read data from (its real path)."""
    root = tmp_path / "data"
    root.mkdir()
    return root.resolve()
