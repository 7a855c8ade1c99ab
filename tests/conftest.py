"""Fixtures shared across test folders."""
from __future__ import annotations

import os
import tempfile

import pytest

# Nothing downloads at test time: the Hugging Face libraries never ask the hub, here and in every process the
# tests start (pretrained models are tiny ones the tests save locally).
os.environ["HF_HUB_OFFLINE"] = "1"
# What trainforge remembers between runs (folder manifests, calibration factors) goes to a fresh folder, here and in
# every process the tests start: never the user's ~/.cache/trainforge.
os.environ["TRAINFORGE_HOME"] = tempfile.mkdtemp(prefix="trainforge-home-")

from postgres_server import Postgres, postgres_bin


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the session, started here (initdb + pg_ctl on a free port)."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; "
                    "apt-get install postgresql (.ci/run does) to run the PostgreSQL tests")
    server = Postgres(bindir).start()
    try:
        yield server.url
    finally:
        server.stop()
