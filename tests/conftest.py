"""Fixtures shared across test folders."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Nothing downloads at test time: the Hugging Face libraries never ask the hub, here and in every process the
# tests start (pretrained models are tiny ones the tests save locally).
os.environ["HF_HUB_OFFLINE"] = "1"
# What trainforge computes once per machine (token shards, calibration) goes to a home of the test session, never
# to the user's ~/.cache/trainforge; tests that need their own set TRAINFORGE_HOME themselves.
# Removed when pytest ends (pytest_unconfigure: an xdist worker leaves without running atexit) or, failing that, at
# exit.
os.environ["TRAINFORGE_HOME"] = tempfile.mkdtemp(prefix="trainforge-test-home-")
atexit.register(shutil.rmtree, os.environ["TRAINFORGE_HOME"], ignore_errors=True)

from chromium import CHROMIUM_MISSING, headless_chromium
from mlflow_server import run_mlflow_server
from postgres_server import Postgres, postgres_bin
from slurm_cluster import SlurmCluster, slurm_missing

# The modules that take longest (minutes on 2 cores, `--durations` of .ci/run), longest first. `make test` hands
# modules to its workers in collection order (pytest-xdist --dist loadscope), so these go first: a long module
# started last would run alone while the other workers idle. Only the order changes; a module missing here keeps
# its place after them.
LONGEST_FIRST = (
    "jobs/test_jobs_slurm.py", "e2e/test_detection.py", "e2e/test_detection_runs.py", "e2e/test_segmentation.py",
    "e2e/test_fixed_seed_table.py",
    "distributed/test_launch_slurm.py", "e2e/test_medical_volumes.py", "e2e/test_fusion.py",
    "benchmarks/test_gpu_check.py", "e2e/test_hostile_files_round3.py", "jobs/test_jobs_dashboard.py",
    "e2e/test_distill_tasks.py", "planning/test_plan.py", "e2e/test_plugin_tasks.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item) -> int:
        path = item.path.as_posix()
        return next((i for name, i in rank.items() if path.endswith("/tests/" + name)), len(rank))

    items.sort(key=place)  # stable: the rest keep pytest's order


def pytest_unconfigure(config):
    shutil.rmtree(os.environ["TRAINFORGE_HOME"], ignore_errors=True)


# The test modules (node ids) with a failed test: their shared folders stay to look at.
_FAILED_MODULES: set[str] = set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        _FAILED_MODULES.add(item.nodeid.split("::")[0])
    return report


@pytest.fixture(scope="module")
def module_tmp_path(request, tmp_path_factory) -> Path:
    """A folder for the runs a module's tests share (a module-scoped fixture's), removed when the module is done and
    all of its tests passed, as pytest removes a passed test's tmp_path (tmp_path_retention_policy): trained
    detectors with their checkpoints are GBs that would otherwise stay until the session ends."""
    path = tmp_path_factory.mktemp(request.node.path.stem)
    yield path
    if request.node.nodeid not in _FAILED_MODULES:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def browser():
    """Debian's headless Chromium driven by Selenium (nothing downloaded). Without the browser or its driver, every
    test that asks for it skips and says what to install: none errors on a machine that lacks them."""
    if CHROMIUM_MISSING is not None:
        pytest.skip(CHROMIUM_MISSING)
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for the session, started here (initdb + pg_ctl on a free port)."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; "
                    "as root, `make test` installs it (scripts/test-system-packages.sh)")
    server = Postgres(bindir).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` for the session (SQLite backend, artifacts through its proxy): its URL."""
    yield from run_mlflow_server(tmp_path_factory.mktemp("mlflow-server"))


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster for the session (munged, slurmctld, two slurmd on localhost: nodes tf1 and tf2, 4 CPUs
    and 3000 MB each; partition `debug` holds both, `one` holds tf1 alone). Skips with one line where Slurm and
    munge are not installed or this is not root. Each node also declares 2 GPUs as GRES (counted, no devices): Slurm
    schedules GPU requests, and a job that gets one trains on the CPU."""
    why = slurm_missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster({"tf1": 3000, "tf2": 3000}, cpus=4, gpus=2,
                           partitions={"debug": ["tf1", "tf2"], "one": ["tf1"]}).start()
    try:
        yield cluster
    finally:
        cluster.stop()
