"""Every shipped recipe at a fixed seed: its first 20 training losses and its eval.json, against the table stored
beside this file (fixed_seed_table.json). Issue 41 moves classification, language modelling and chat onto one task
interface "with behaviour unchanged"; this table, written by the code before that change, is what unchanged means
(to 1e-6). Each recipe runs scaled down as test_recipes_run.py runs it (tiny local stand-ins for hub models),
deterministically, in one process of their own whose numerics are pinned (PINNED): one thread, the AVX2 code paths of
ATen and MKL, and ATen's own convolution instead of oneDNN's, whose blocking follows the CPU's caches. The recipes run
one after another in that process (each run seeds everything it draws from, so its numbers do not depend on what ran
before it), which spares ten interpreter starts. Without the
pins, ResNet-50 at micro-batch 2 (its batch norm over two samples) turns the last-bit difference between two CPUs'
kernels into 1e-4 after one step.

    .venv/bin/python -m pytest tests/e2e/test_fixed_seed_table.py                         # compare
    TRAINFORGE_WRITE_TABLE=1 .venv/bin/python -m pytest tests/e2e/test_fixed_seed_table.py # rewrite: only for a
                                                                                          # change meant to alter it
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_recipes_run import ON_FILES, SCALE_DOWN, files  # noqa: F401  (files: the fixture of the local stand-ins)
from trainforge.config import builtin_recipes
from trainforge.metrics_file import read_metrics

TABLE = Path(__file__).with_name("fixed_seed_table.json")
STEPS = 20
TOLERANCE = 1e-6
PINNED = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
          "ONEDNN_MAX_CPU_ISA": "AVX2"}
RUN = """import json, sys, traceback
from pathlib import Path
import torch
torch.backends.mkldnn.enabled = False
import trainforge
for name, overrides, run_dir in json.loads(Path(sys.argv[1]).read_text()):
    try:
        trainforge.train(trainforge.load_config(name, overrides), run_dir=run_dir)
    except BaseException:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "failed.txt").write_text(traceback.format_exc())
"""
FIXED = [f"train.max_steps={STEPS}", f"train.eval_every_steps={STEPS}", f"train.checkpoint_every_steps={STEPS}",
         "train.log_every_steps=1", "train.deterministic=true", "train.num_threads=1", "train.device=cpu",
         "train.early_stopping=null", "data.num_workers=0", "log.progress=false", "log.tensorboard=false",
         "log.report=false", "seed=0"]


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """Every shipped recipe run once, in one pinned process; {name: its run directory}."""
    root = tmp_path_factory.mktemp("fixed-seed")
    plan = [[name, [*(ON_FILES[name](files) if name in ON_FILES else SCALE_DOWN[name]), *FIXED], str(root / name)]
            for name in sorted(builtin_recipes())]
    (root / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run([sys.executable, "-c", RUN, str(root / "plan.json")], env={**os.environ, **PINNED},
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
    return {name: root / name for name, _, _ in plan}


def recipe_run(name: str, run_dir: Path) -> dict:
    """The recipe's first STEPS training losses and its eval.json."""
    if (run_dir / "failed.txt").exists():
        pytest.fail(f"{name} failed:\n{(run_dir / 'failed.txt').read_text()[-3000:]}")
    losses = [r["loss"] for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"]
    evaluated = json.loads((run_dir / "eval.json").read_text())
    return {"losses": losses[:STEPS], "eval": {k: v for k, v in evaluated.items() if isinstance(v, (int, float))}}


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE) or (math.isnan(a) and math.isnan(b))


def test_the_table_holds_every_shipped_recipe():
    if os.environ.get("TRAINFORGE_WRITE_TABLE"):
        pytest.skip("writing the table")
    assert set(json.loads(TABLE.read_text())) == set(builtin_recipes())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(builtin_recipes()))
def test_a_recipe_trains_and_evaluates_as_the_table_says(name, runs):
    got = recipe_run(name, runs[name])
    assert len(got["losses"]) == STEPS
    if os.environ.get("TRAINFORGE_WRITE_TABLE"):
        table = json.loads(TABLE.read_text()) if TABLE.exists() else {}
        table[name] = got
        TABLE.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
        return
    want = json.loads(TABLE.read_text())[name]
    diverged = [(i, a, b) for i, (a, b) in enumerate(zip(got["losses"], want["losses"])) if not close(a, b)]
    assert not diverged, f"{name}: first losses that differ (step index, now, table): {diverged[:3]}"
    assert set(got["eval"]) == set(want["eval"]), (got["eval"], want["eval"])
    differ = {k: (got["eval"][k], want["eval"][k]) for k in want["eval"] if not close(got["eval"][k], want["eval"][k])}
    assert not differ, f"{name}: eval.json differs (now, table): {differ}"
