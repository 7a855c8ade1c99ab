"""No branch on a task's name outside the task registry (issue 41, point 5): a comparison of something named like a
task with a task name (`info.task == "lm"`, `doc.get("task") in ("lm", ...)`), or an `is_lm`-style flag, anywhere in
src/trainforge but src/trainforge/tasks/. What differs between tasks is asked of the task (`task_of(info).loss`,
`.generates`, `.ordered_splits`, ...); a model family or a data source that serves only some tasks declares them as
data (`DataFit(..., tasks=...)`, a table keyed by task name), never by comparing."""
from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "trainforge"
REGISTRY = "tasks"  # the one folder where a task may be named in a branch


def _task_names() -> set[str]:
    """Every registered task's name (from the registry itself, so a task added later is checked too), and chat, the
    language-modelling data a recipe may still call its task."""
    from trainforge.tasks import TASKS

    return set(TASKS.names()) | {"chat"}


TASK_NAMES = _task_names()
FLAG = re.compile(r"^_?is_(lm|classification|chat|text_classification|language_model)$")


def _names_a_task(node: ast.AST) -> bool:
    return "task" in ast.unparse(node).lower()


def _is_task_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in TASK_NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value in TASK_NAMES for e in node.elts)
    return False


def compares(node: ast.AST, is_value, names_it) -> bool:
    """`node` is a comparison of a value (`is_value`) with something `names_it` says is a task's or modality's name."""
    if not isinstance(node, ast.Compare):
        return False
    parts = [node.left, *node.comparators]
    return any(is_value(p) for p in parts) and any(names_it(p) for p in parts if not is_value(p))


def task_branches(tree: ast.AST) -> list[int]:
    """Lines of the comparisons with a task name and of the is_<task> flags in `tree`."""
    lines = []
    for node in ast.walk(tree):
        if compares(node, _is_task_name, _names_a_task):
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and FLAG.match(node.id):
            lines.append(node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.arg)) and FLAG.match(getattr(node, "name", None) or
                                                                          getattr(node, "arg", "")):
            lines.append(node.lineno)
    return sorted(lines)


def branches_by_file(src: Path = SRC) -> dict[str, list[int]]:
    found = {}
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).parts[0] == REGISTRY:
            continue
        lines = task_branches(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[str(path.relative_to(src))] = lines
    return found


# ---- modalities (issue 51, point 4): what differs between kinds of input is asked of MODALITIES ----------------

MODALITY_REGISTRY = ("data", "modalities")  # the one folder where a modality may be named in a branch


def _is_string(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    return False


def modality_branches(tree: ast.AST) -> list[int]:
    """Lines comparing something named like a modality with a string, any string (`info.modality == "image"`,
    `meta.get("modality") in ("volume", "volumes")`): the registry's own names and the names a user might write."""
    return sorted(node.lineno for node in ast.walk(tree) if compares(node, _is_string, _names_a_modality))


def _names_a_modality(node: ast.AST) -> bool:
    """`modality`, `info.modality`, `meta["modality"]`, `meta.get("modality")`, `modality.name`: a modality's name;
    not what a modality says of itself (`modality.model_preprocessing != "apply"` asks the registry)."""
    if isinstance(node, ast.Name):
        return "modalit" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "modalit" in node.attr.lower() or (node.attr == "name" and _names_a_modality(node.value))
    if isinstance(node, ast.Subscript):
        return "modalit" in ast.unparse(node.slice).lower()
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Attribute) and node.func.attr == "get" and any(
            "modalit" in ast.unparse(a).lower() for a in node.args[:1])
    return False


def modality_branches_by_file(src: Path = SRC) -> dict[str, list[int]]:
    found = {}
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).parts[:2] == MODALITY_REGISTRY:
            continue
        lines = modality_branches(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[str(path.relative_to(src))] = lines
    return found


def test_no_modality_branch_outside_the_modality_registry():
    found = modality_branches_by_file()
    assert not found, ("modality branches outside trainforge/data/modalities (ask MODALITIES.get(...) instead): "
                       + "; ".join(f"{f} at lines {lines}" for f, lines in found.items()))


def test_a_modality_branch_planted_in_a_copy_of_the_source_is_found(tmp_path):
    import shutil

    copy = tmp_path / "trainforge"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    pipeline = copy / "data" / "pipeline.py"
    pipeline.write_text(pipeline.read_text() + '\n\ndef planted(data):\n    return data.modality == "volumes"\n')
    serving = copy / "compression" / "serving.py"
    serving.write_text(serving.read_text() + '\n\ndef planted(meta):\n    return meta.get("modality") in ("image",)\n')
    (copy / "data" / "modalities" / "planted.py").write_text('def ok(info):\n    return info.modality == "image"\n')
    found = modality_branches_by_file(copy)
    assert sorted(found) == ["compression/serving.py", "data/pipeline.py"], found
    assert all(len(lines) == 1 for lines in found.values()), found
    assert modality_branches(ast.parse('m = MODALITIES.get(info.modality)\nok = info.modality in MODALITIES\n'
                                       'ok = modality.model_preprocessing != "apply"\n')) == []
    assert modality_branches(ast.parse('a = modality.name == "text"\nb = doc["modality"] != "image"\n')) == [1, 2]


def test_no_task_branch_outside_the_task_registry():
    found = branches_by_file()
    assert not found, ("task branches outside trainforge/tasks (ask the task instead): "
                       + "; ".join(f"{f} at lines {lines}" for f, lines in found.items()))


def test_the_shipped_tasks_are_in_the_registry():
    from trainforge.tasks import TASKS

    assert {"classification", "lm"} <= set(TASKS.names())


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
    for task in ("segmentation", "detection"):  # the names of every registered task, not a list written here
        assert task_branches(ast.parse(f'table = NETS if info.task == "{task}" else OTHER\n')) == [1]
    fine = '''
TASKS.register("lm")(LanguageModelling)
task = TASKS.get(cfg.task)
name = "lm"
'''
    assert task_branches(ast.parse(fine)) == []


def test_a_branch_planted_in_a_copy_of_the_source_is_found_and_the_registry_may_branch(tmp_path):
    import shutil

    copy = tmp_path / "trainforge"
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__"))
    loop = copy / "training" / "loop.py"
    loop.write_text(loop.read_text() + '\n\ndef planted(info):\n    return 1 if info.task == "lm" else 0\n')
    nets = copy / "models" / "monai_nets.py"  # where issue 51 found the blind spot: a task the old list lacked
    nets.write_text(nets.read_text() + '\n\ndef planted(info):\n    return info.task == "segmentation"\n')
    (copy / "tasks" / "planted.py").write_text('def ok(info):\n    return info.task == "lm"\n')
    found = branches_by_file(copy)
    assert sorted(found) == ["models/monai_nets.py", "training/loop.py"], found
    assert all(len(lines) == 1 for lines in found.values()), found


def test_the_tasks_command_lists_each_task_with_its_default_metric(capsys):
    import json

    import pytest

    from trainforge.cli import main

    with pytest.raises(SystemExit) as code:
        main(["tasks", "--json"])
    assert code.value.code in (0, None)
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["classification"]["default_metric"], rows["classification"]["direction"]) == ("accuracy", "max")
    assert (rows["lm"]["default_metric"], rows["lm"]["direction"]) == ("loss", "min")
    assert rows["lm"]["metrics"] == ["loss", "perplexity"] and all(r["description"] for r in rows.values())
