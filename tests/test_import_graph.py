"""No import cycle between the modules of ``src/trainforge`` (issue 13, item 5), and each folder one layer whose
imports point down only (issue 27): ``LAYERS`` below is the architecture of docs/architecture.md.

The graph is built statically with ``ast`` from every ``.py`` file under ``src/trainforge``:

* every ``import trainforge.x``, ``from trainforge.x import y`` and relative import (any level) is an
  edge, wherever it is written: module level, inside a function or method, inside a lazy
  ``__getattr__`` re-export of a package ``__init__``. A function-level import still runs, so it counts;
* imports under ``if TYPE_CHECKING:`` are skipped: they never run;
* ``from trainforge.pkg import name`` points at ``trainforge.pkg.name`` when that is a module, else at
  ``trainforge.pkg`` (the package's ``__init__.py``);
* no implicit edge is added from a module to its parent packages (importing ``trainforge.data.base``
  runs ``trainforge/data/__init__.py`` first, but a package ``__init__`` is expected to import its own
  submodules, so counting that would make every re-export a "cycle").

A cycle is reported as ``a -> b -> c -> a``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = "trainforge"
SRC = Path(__file__).resolve().parents[1] / "src" / PKG


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Yield every Import/ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside, if it is one of ours."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


@functools.lru_cache(maxsize=None)
def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for alias in node.names:
                    sub = f"{prefix}.{alias.name}"
                    targets.append(sub if sub in mods else prefix)
            for target in targets:
                if target.split(".")[0] != PKG:
                    continue
                resolved = _resolve(target, mods)
                if resolved and resolved != mod:
                    graph[mod].add(resolved)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """(one shortest cycle, all its modules) per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    sccs: list[list[str]] = []
    counter = 0

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)

    cycles = []
    for comp in sccs:
        members = set(comp)
        start = comp[0]
        # shortest path back to start inside the component (BFS)
        prev: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append((list(reversed(path)) + [start], comp))
    return cycles


# Each folder (or top-level module) of src/trainforge in one layer; an import may point to its own layer's other
# folders (the folder graph stays acyclic) or below, never up. The package itself (`trainforge`, its __init__) and
# the CLI are the top.
LAYERS = [
    ("foundations", {"errors", "files", "registry", "imports", "metrics_file", "integrity", "console", "config",
                     "hardware", "confine", "hub", "layout"}),
    ("data and models", {"data", "models"}),
    ("engine", {"engine"}),
    ("estimation and reports", {"planning", "report"}),
    ("training", {"training"}),
    ("stages", {"launch", "tuning", "compression", "tracking", "jobs"}),
    ("entry points", {"cli", "__main__", ""}),
]
LEVEL = {folder: i for i, (_, folders) in enumerate(LAYERS) for folder in folders}


def folder_of(module: str) -> str:
    """The folder (or top-level module) of src/trainforge a module is in: trainforge.engine.optim -> engine."""
    return module.split(".")[1] if "." in module else ""


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {folder_of(m): set() for m in graph}
    for module, targets in graph.items():
        for target in targets:
            if folder_of(target) != folder_of(module):
                folders[folder_of(module)].add(folder_of(target))
    return folders


def test_every_folder_has_a_layer():
    unknown = sorted(f for f in folder_graph(import_graph()) if f not in LEVEL)
    assert not unknown, f"put these in LAYERS (and docs/architecture.md): {unknown}"


def test_folder_imports_point_down_only():
    graph = import_graph()
    upward = sorted(f"{m} -> {t}  ({LAYERS[LEVEL[folder_of(m)]][0]} -> {LAYERS[LEVEL[folder_of(t)]][0]})"
                    for m, targets in graph.items() for t in targets
                    if LEVEL.get(folder_of(t), -1) > LEVEL.get(folder_of(m), len(LAYERS)))
    assert not upward, f"{len(upward)} import(s) point up a layer:\n" + "\n".join(upward)


def test_no_folder_cycles():
    cycles = find_cycles(folder_graph(import_graph()))
    assert not cycles, "folders importing each other: " + "; ".join(" -> ".join(c) for c, _ in cycles)


def test_the_layer_check_sees_an_upward_import():
    graph = {"trainforge.engine.optim": {"trainforge.training.loop"}, "trainforge.training.loop": set()}
    assert LEVEL[folder_of("trainforge.training.loop")] > LEVEL[folder_of("trainforge.engine.optim")]
    assert find_cycles(folder_graph({**graph, "trainforge.training.loop": {"trainforge.engine.optim"}}))


def test_graph_sees_function_level_imports():
    graph = import_graph()
    assert len(graph) > 50
    assert any(graph.values())


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    lines = [" -> ".join(cycle) + ("" if len(comp) == len(cycle) - 1 else f"\n    (all entangled: {', '.join(comp)})")
             for cycle, comp in cycles]
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(lines)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_report_does_not_import_training():
    graph = import_graph()
    bad = {m: sorted(w for w in graph[m] if w.startswith(f"{PKG}.training"))
           for m in graph if m.startswith(f"{PKG}.report")}
    assert not any(bad.values()), bad


def test_the_planner_does_not_reach_the_training_loop():
    """The planner (plan, auto, the calibration store, render) never reaches `training.loop`, or the loop's
    `micro_batch_size: auto` is a cycle; calibration, which runs real steps, lives in training/."""
    graph = import_graph()
    loop = f"{PKG}.training.loop"
    reaching = sorted(m for m in graph if m.startswith(f"{PKG}.planning") and loop in _reachable(graph, m))
    assert not reaching, reaching
