"""Where the code branches on a task's name (issue 41): a comparison of something named like a task with a task name
(`info.task == "lm"`, `doc.get("task") in ("lm", ...)`), or an `is_lm`-style flag. Issue 41 moves every one of them
into a task registry; until it is done, this test holds the line: no file may gain a branch, the known ones are
listed by file, and the list only shrinks (a file that loses one must have its count lowered here)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "trainforge"
TASK_NAMES = {"classification", "lm", "chat"}
FLAG = re.compile(r"^_?is_(lm|classification|chat|text_classification|language_model)$")

# the 28 branches of issue 41's review, by file: each moves into the task registry
KNOWN = {
    "compression/bench.py": 1, "compression/predict.py": 1, "compression/render.py": 3, "data/pipeline.py": 3,
    "data/sources/synthetic.py": 1, "engine/losses.py": 1, "models/hf.py": 8, "models/zoo.py": 2,
    "planning/kernels.py": 1, "planning/simulate.py": 2, "tracking/mlflow_run.py": 1, "training/evaluate.py": 2,
    "training/generate.py": 1, "training/run.py": 1,
}


def _names_a_task(node: ast.AST) -> bool:
    return "task" in ast.unparse(node).lower()


def _is_task_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in TASK_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value in TASK_NAMES for e in node.elts)
    return False


def task_branches(tree: ast.AST) -> list[int]:
    """Lines of the comparisons with a task name and of the is_<task> flags in `tree`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            if any(_is_task_name(p) for p in parts) and any(_names_a_task(p) for p in parts if not _is_task_name(p)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and FLAG.match(node.id):
            lines.append(node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.arg)) and FLAG.match(getattr(node, "name", None) or
                                                                          getattr(node, "arg", "")):
            lines.append(node.lineno)
    return sorted(lines)


def branches_by_file() -> dict[str, list[int]]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        lines = task_branches(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[str(path.relative_to(SRC))] = lines
    return found


def test_no_file_gains_a_task_branch_and_the_known_ones_only_go():
    found = branches_by_file()
    grown = {f: (len(lines), KNOWN.get(f, 0), lines) for f, lines in found.items() if len(lines) > KNOWN.get(f, 0)}
    assert not grown, ("task branches added (move them into the task, issue 41): "
                       + "; ".join(f"{f}: {n} > {k} at lines {lines}" for f, (n, k, lines) in grown.items()))
    shrunk = {f: (len(found.get(f, [])), k) for f, k in KNOWN.items() if len(found.get(f, [])) < k}
    assert not shrunk, f"branches moved out (good): lower KNOWN to match: {shrunk}"


def test_the_branch_check_sees_a_planted_branch():
    planted = '''
def loss(logits, y, info):
    if info.task == "lm":
        return 1
    kind = "token" if cfg.data.task in ("lm", "chat") else "class"
    is_lm = spec.task_name == "lm"
    return 0
'''
    assert task_branches(ast.parse(planted)) == [3, 5, 6, 6]
    fine = '''
TASKS.register("lm")(LanguageModelling)
task = TASKS.get(cfg.task)
name = "lm"
'''
    assert task_branches(ast.parse(fine)) == []
