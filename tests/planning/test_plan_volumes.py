"""The planner on volumes: the simulated peak of a 3D network grows with the patch it sees, and matches the kernel's
peak RSS growth of a real CPU step (an independent measurement, not the simulator's own tracker) within 10%."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rss_probe import MODEL, OPTIM, volumes
from trainforge.planning.simulate import simulate_step

PROBE = Path(__file__).with_name("rss_probe.py")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("size", [48, 64])
def test_the_simulated_peak_of_a_3d_densenet_is_the_real_steps_rss_growth_within_10_percent(size):
    simulated = simulate_step(MODEL, OPTIM, volumes(size), micro_batch_size=2).peak_bytes
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run([sys.executable, str(PROBE), str(size), "2"], capture_output=True, text=True, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])["rss_growth_bytes"]
    assert simulated == pytest.approx(measured, rel=0.10), (simulated, measured)


def test_the_simulation_sees_the_patch():
    small, large = (simulate_step(MODEL, OPTIM, volumes(s), micro_batch_size=2) for s in (32, 64))
    assert large.param_count == small.param_count
    assert large.activation_bytes > 6 * small.activation_bytes  # 8x the voxels
