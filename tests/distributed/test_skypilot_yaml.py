"""The SkyPilot task files `launch skypilot` writes, read by SkyPilot's own parser (`sky.Task.from_yaml`, offline: no
cloud is asked). SkyPilot pins click<8.2 and uvicorn<0.36, older than trainforge's, so it lives in a venv of its own
that `make test` creates (.venv-skypilot); the test runs the parser there, in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from trainforge.launch.manifests import JobSpec, render

SKY_PYTHON = Path(os.environ.get("TRAINFORGE_SKYPILOT_PYTHON",
                                 Path(__file__).resolve().parents[2] / ".venv-skypilot" / "bin" / "python"))
PARSE = """
import json, sys
import sky
out = {}
for path in sys.argv[1:]:
    try:
        task = sky.Task.from_yaml(path)
        (res,) = task.resources
        out[path] = {"ok": True, "num_nodes": task.num_nodes, "accelerators": res.accelerators,
                     "cpus": res.cpus, "spot": res.use_spot, "envs": dict(task.envs),
                     "mounts": sorted((task.file_mounts or {}) | {k: 1 for k in (task.storage_mounts or {})})}
    except Exception as e:  # noqa: BLE001 - the parser's refusal is the answer
        out[path] = {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0]}
print(json.dumps(out))
"""


def _parse(tmp_path: Path, texts: dict[str, str]) -> dict[str, dict]:
    if not SKY_PYTHON.exists():
        pytest.skip(f"SkyPilot's parser is not installed at {SKY_PYTHON} (`make test` creates .venv-skypilot; its pins "
                    "conflict with trainforge's, so it cannot share the test venv)")
    paths = {}
    for name, text in texts.items():
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(text)
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run([str(SKY_PYTHON), "-c", PARSE, *map(str, paths.values())], capture_output=True, text=True,
                            timeout=300, env={"PATH": os.environ["PATH"], "HOME": str(home)})
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    return {name: parsed[str(path)] for name, path in paths.items()}


def test_skypilot_parses_every_task_file_launch_writes_and_refuses_a_broken_one(tmp_path):
    recipe = "name: demo\ntrain:\n  epochs: 1\n"
    texts = {
        "gpu": render("skypilot", JobSpec(name="demo", recipe_text=recipe, nodes=2, gpus_per_node=4,
                                          accelerator="A100", env={"NCCL_DEBUG": "INFO"})),
        "spot": render("skypilot", JobSpec(name="demo", recipe_text=recipe, spot=True, bucket="s3://team/runs",
                                           gpus_per_node=8)),
        "cpu": render("skypilot", JobSpec(name="demo", recipe_text=recipe, gpus_per_node=0, procs_per_node=2,
                                          cpus_per_gpu=2)),
    }
    texts["misspelled"] = texts["cpu"].replace("num_nodes:", "num_node:")
    got = _parse(tmp_path, texts)
    assert got["gpu"]["ok"] and got["gpu"]["num_nodes"] == 2 and got["gpu"]["accelerators"] == {"A100": 4}
    assert got["gpu"]["cpus"] == "32+" and got["gpu"]["envs"] == {"NCCL_DEBUG": "INFO"}
    assert got["spot"]["ok"] and got["spot"]["spot"] and "/runs" in got["spot"]["mounts"]
    assert got["cpu"]["ok"] and got["cpu"]["accelerators"] is None and got["cpu"]["cpus"] == "4+"
    assert not got["misspelled"]["ok"] and "num_nodes" in got["misspelled"]["error"]
