"""Each decision has one implementation (issue 13): the run's setup, the largest micro-batch that fits,
precision, the OOM shrink rule, atomic writes, the CPU count. A second copy of any of them would drift from the
first."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "trainforge"


def _trees() -> dict[str, ast.AST]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))}


def definitions(name: str) -> list[str]:
    return [path for path, tree in _trees().items()
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name]


def callers(name: str) -> set[str]:
    found = set()
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name):
                    found.add(path)
    return found


def test_each_decision_has_one_implementation():
    assert definitions("resolve") == ["training/setup.py"]
    assert definitions("largest_fitting") == ["planning/memory.py"]
    assert definitions("resolve_precision") == ["engine/precision.py"]
    assert definitions("shrink_micro_batch") == ["engine/microbatch.py"]
    assert definitions("write_text_atomic") == ["files.py"]
    assert definitions("available_cpus") == ["hardware/cpus.py"]  # how many worker processes the data stage starts


def test_only_the_one_search_walks_the_candidate_micro_batches():
    assert callers("candidate_micro_batches") == {"planning/memory.py"}
    assert callers("largest_fitting") == {"planning/auto.py", "planning/plan.py"}  # auto (train, jobs) and plan
    assert callers("auto_micro_batch") == {"training/setup.py"}  # the train run and the job admission resolve


def test_bf16_support_is_only_read_to_resolve_precision():
    assert callers("supports_bf16") <= {"training/setup.py", "training/evaluate.py"}
    assert callers("resolve_precision") == {"training/setup.py", "training/evaluate.py", "planning/plan.py"}
    assert callers("shrink_micro_batch") == {"training/setup.py"}
