"""The README's "Bring your own model / data" example, run as a user would: its files written next to each
other, then `trainforge train my.yaml` from that directory. Plus the mismatches a user meets on the way."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUIET = ["log.progress=false", "log.tensorboard=false", "log.report=false"]


def readme_example(tmp_path: Path) -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Bring your own model / data"):]
    section = section[: section.index("\n## ", 5)]
    files = {}
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", section, re.S):
        name = block.splitlines()[0].lstrip("# ").split(":")[0].strip()  # each block starts "# <file name>"
        (tmp_path / name).write_text(block)
        files[name] = block
    return files


def trainforge(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainforge", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_readme_example_trains_a_users_module_class_on_a_users_data(tmp_path):
    files = readme_example(tmp_path)
    assert set(files) == {"mymodel.py", "mydata.py", "my.yaml"}
    model_lines = [line for line in files["mymodel.py"].splitlines() if line.strip()]
    assert len(model_lines) <= 15, "the model example stays short"
    proc = trainforge(tmp_path, "train", "my.yaml", *QUIET, "--run-dir", "run", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["status"] == "completed"
    assert result["eval"]["accuracy"] > 0.9  # the example learns its task, not just runs
    assert json.loads((tmp_path / "run" / "final" / "model.json").read_text())["model"]["target"] == "mymodel:MyCNN"


USER_CODE = '''
import torch
from torch import nn


class NeedsDepth(nn.Module):
    def __init__(self, in_channels, num_classes, depth):
        super().__init__()


class Broken(nn.Module):
    def __init__(self, in_channels, num_classes):
        super().__init__()
        self.fc = nn.Linear(in_channels % 3.5j, num_classes)


class OnlyText(nn.Module):
    def __init__(self, vocab_size, num_classes):
        super().__init__()


class Items(torch.utils.data.Dataset):
    def __init__(self, n=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 6, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
'''


@pytest.mark.parametrize("overrides, expected", [
    (["model.target=usercode:NeedsDepth"],
     "model.args.depth: required by usercode:NeedsDepth(in_channels, num_classes, depth); set model.args.depth"),
    (["model.target=usercode:NeedsDepth", "model.args={depth: 2, widht: 3}"],
     "model.args.widht: unknown argument for usercode:NeedsDepth(in_channels, num_classes, depth); accepted: depth"),
    (["model.target=usercode:Broken"], "model.target: usercode:Broken(in_channels, num_classes) failed: TypeError"),
    (["model.target=usercode:OnlyText"],
     "model.target: usercode:OnlyText(vocab_size, num_classes) needs vocab_size, which this data does not provide"),
    (["data.target=usercode:Items", "data.args={rows: 3}"],
     "data.args.rows: unknown argument for usercode:Items(n=64, seed=0); accepted: n"),
])
def test_a_mismatch_with_the_users_code_is_one_line_with_the_signature(tmp_path, overrides, expected):
    (tmp_path / "usercode.py").write_text(USER_CODE)
    args = ["data.source=digits", "model.name=custom", "model.args={}", "model.target=usercode:NeedsDepth", *overrides, *QUIET,
            "train.max_steps=1"]
    if any(o.startswith("data.target") for o in overrides):
        args = ["data.source=custom", *args[1:]]
    proc = trainforge(tmp_path, "train", *args, "--run-dir", "run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_a_users_dataset_class_is_read_with_the_run_seed(tmp_path):
    (tmp_path / "usercode.py").write_text(USER_CODE)
    proc = trainforge(tmp_path, "train", "data.source=custom", "data.target=usercode:Items", "data.args={n: 200}",
                      "model.name=mlp", "model.args={}", "data.augment={}", *QUIET, "train.max_steps=2", "--run-dir", "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "data_report.json").read_text())
    assert report["rows_read"] == 200 and report["source"] == "custom"
