"""What cleaning dropped is said on the console, in the summary table and in --json, not only in
data_report.json."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RUN = ["model.name=mlp", "model.args={}", "data.augment={}", "train.max_steps=2", "train.global_batch_size=16", "log.progress=false",
       "log.tensorboard=false", "log.report=false", "train.early_stopping=null"]


def write_csv(path: Path) -> Path:
    rows = [f"{i % 7}.{i % 3},{(i * 3) % 11}.5,{name}" for i, name in enumerate(["setosa", "versicolor", "virginica"] * 40)]
    path.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    return path


def train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainforge", "train", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)


def test_a_class_dropped_by_classes_is_said_on_the_console_and_in_json(tmp_path):
    csv = write_csv(tmp_path / "iris.csv")
    common = ["data.source=csv", f"data.path={csv}", "data.args={classes: [setosa, versicolor]}", *RUN]
    proc = train(tmp_path, *common, "--run-dir", "a", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "data: 120 rows read, 80 kept, dropped 40 (bad_label 40)" in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert any("33" in w and "virginica" in w for w in warnings), proc.stderr  # 33% of the rows, the label named
    doc = json.loads(proc.stdout)
    assert doc["data"]["rows_read"] == 120 and doc["data"]["dropped"]["bad_label"] == 40
    assert doc["data"]["warnings"] == [w.removeprefix("warning: ") for w in warnings]

    table = train(tmp_path, *common, "--run-dir", "b")
    assert table.returncode == 0, table.stderr[-2000:]
    assert "80 of 120 rows kept, 1 warning(s)" in table.stdout and "data_report.json" in table.stdout
