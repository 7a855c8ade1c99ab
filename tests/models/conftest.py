from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, so weights and example data are fixed."""
    torch.manual_seed(0)
