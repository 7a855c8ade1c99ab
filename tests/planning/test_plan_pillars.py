"""The planner on LiDAR pillars (issue 52, acceptance 6): max_voxels fixes the step's shapes, so the fake-tensor
simulation of a PointPillars step is the real CPU step's peak RSS growth (the kernel's VmHWM, an independent
measurement) within 15%, at two pillar caps; and the simulated activations grow with the cap."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rss_probe import OPTIM, PILLARS_MODEL, pillars
from trainforge.planning.simulate import simulate_step

PROBE = Path(__file__).with_name("rss_probe.py")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("max_voxels", [4000, 12000])
def test_the_simulated_peak_of_pointpillars_is_the_real_steps_rss_growth_within_15_percent(max_voxels):
    simulated = simulate_step(PILLARS_MODEL, OPTIM, pillars(max_voxels), micro_batch_size=2).peak_bytes
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    done = subprocess.run([sys.executable, str(PROBE), "pillars", str(max_voxels), "2"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])["rss_growth_bytes"]
    assert simulated == pytest.approx(measured, rel=0.15), (simulated, measured)


def test_the_simulation_sees_the_pillar_cap():
    small, large = (simulate_step(PILLARS_MODEL, OPTIM, pillars(v), micro_batch_size=2) for v in (2000, 16000))
    assert large.param_count == small.param_count
    assert large.activation_bytes > small.activation_bytes + 2 * 14000 * 32 * 64 * 4  # the pillar net's (B, V, P, C)
