"""No import cycle between the modules of ``src/trainforge`` (issue 13, item 5; type-only imports included since
issue 39), and each folder one layer whose imports point down only (issue 27): ``LAYERS`` below is the architecture
of docs/architecture.md.

The graph is built statically with ``ast`` from every ``.py`` file under ``src/trainforge``:

* every ``import trainforge.x``, ``from trainforge.x import y`` and relative import (any level) is an
  edge, wherever it is written: module level, inside a function or method, inside a lazy
  ``__getattr__`` re-export of a package ``__init__``. A function-level import still runs, so it counts;
* a module named by a string is an edge too: ``import_module("trainforge.x")``, and each ``"trainforge.x.y"`` value
  of a dict literal (a lazy-export table, which a package's ``__getattr__`` imports on first use);
* imports under ``if TYPE_CHECKING:`` count as well: they never run, but a type two modules share belongs below both,
  so the modules form no cycle even on paper;
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


def _imports(tree: ast.AST, type_only: bool = True):
    """Yield every Import/ImportFrom node; those under ``if TYPE_CHECKING:`` only with ``type_only``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if not type_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


IMPORTING_CALLS = {"import_module", "__import__"}


def _named_modules(tree: ast.AST):
    """Module names an import runs by a string: ``import_module("trainforge.x")`` / ``__import__(...)``, and the values
    of a lazy-export table (a dict literal mapping names to ``"trainforge.x.y"``, read by a package's ``__getattr__``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in IMPORTING_CALLS and node.args and isinstance(node.args[0], ast.Constant):
                if isinstance(node.args[0].value, str):
                    yield node.args[0].value
        elif isinstance(node, ast.Dict):
            for value in node.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str) and value.value.startswith(PKG + "."):
                    yield value.value


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies inside, if it is one of ours."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def module_edges(mod: str, tree: ast.AST, mods: dict[str, Path], is_pkg: bool, type_only: bool = True) -> set[str]:
    """The modules of ours that module ``mod`` (parsed as ``tree``) imports: import statements anywhere, and the
    names it imports by a string (see _named_modules)."""
    targets: list[str] = []
    for node in _imports(tree, type_only):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
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
    targets += list(_named_modules(tree))
    edges = set()
    for target in targets:
        if target.split(".")[0] != PKG:
            continue
        resolved = _resolve(target, mods)
        if resolved and resolved != mod:
            edges.add(resolved)
    return edges


@functools.lru_cache(maxsize=None)
def import_graph(type_only: bool = True) -> dict[str, set[str]]:
    """Every module's edges; ``type_only=False`` leaves out the imports under ``if TYPE_CHECKING:`` (they never run)."""
    mods = _modules()
    return {mod: module_edges(mod, ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), mods,
                              path.name == "__init__.py", type_only)
            for mod, path in mods.items()}


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
                     "hardware", "confine", "hub", "layout", "weights", "geometry", "boxes3d", "points3d", "processes"}),
    ("tasks", {"tasks"}),
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


def _edges_of(module: str, code: str) -> set[str]:
    return module_edges(module, ast.parse(code), _modules(), is_pkg=module.count(".") == 1)


def test_a_module_named_by_a_string_is_an_edge_and_one_pointing_up_fails_the_layer_check():
    """The negative case of issue 39: a lazy-export table (as data/__init__.py keeps) and import_module strings."""
    lazy = '_LAZY = {"build_data": "trainforge.data.pipeline", "fit": "trainforge.training.loop"}\n'
    by_call = 'from importlib import import_module\nloop = import_module("trainforge.training.loop")\n'
    dunder = 'loop = __import__("trainforge.training.loop")\n'
    for code in (lazy, by_call, dunder):
        edges = _edges_of("trainforge.data", code)
        assert "trainforge.training.loop" in edges, code
        graph = {**import_graph(), "trainforge.data": import_graph()["trainforge.data"] | edges}
        upward = [t for t in graph["trainforge.data"] if LEVEL[folder_of(t)] > LEVEL["data"]]
        assert upward == ["trainforge.training.loop"], code
    argv = 'cmd = [sys.executable, "-m", "trainforge.jobs.wrapper"]\n'  # a process started, not an import
    assert _edges_of("trainforge.data", argv) == set()


def test_a_type_only_import_counts_for_cycles():
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainforge.data.stages.clean import x\n"
    assert _edges_of("trainforge.data.samples", code) == {"trainforge.data.stages.clean"}
    graph = {"trainforge.data.samples": _edges_of("trainforge.data.samples", code),
             "trainforge.data.stages.clean": {"trainforge.data.samples"}}
    assert find_cycles(graph)


def test_mlflow_is_one_side_of_the_tracking_line():
    """Issue 39: the MLflow model files live in tracking/; training and compression import no tracking (the observer
    is composed by the caller through engine/hooks.RunObserver), and tracking needs nothing of the training loop."""
    graph = import_graph()
    tracking = {m for m in graph if folder_of(m) == "tracking"}
    for folder in ("training", "compression", "engine"):
        reaching = sorted(m for m, targets in graph.items() if folder_of(m) == folder and targets & tracking)
        assert reaching == [], f"{folder} imports tracking: {reaching}"
    assert not any(t.startswith("trainforge.training.loop") for m in tracking for t in _reachable(graph, m))
    mlflow_users = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                          if any(isinstance(n, (ast.Import, ast.ImportFrom)) and
                                 any((getattr(n, "module", None) or a.name).split(".")[0] == "mlflow" for a in n.names)
                                 for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))))
    assert mlflow_users and all(u.startswith("tracking/") for u in mlflow_users), mlflow_users


# The folders and modules inside data/ are layers too (issue 51, item 6): the records a sample is, then readers and
# tokenizers, the on-disk formats, the stages, the pool, texts made samples, the sources, the pipeline, prepare.
DATA_LAYERS = [
    ("records", {"base", "samples", "seeding", "summary", "source_tasks"}),
    ("readers and tokenizers", {"image", "text"}),
    ("formats", {"formats"}),
    ("stages", {"stages"}),
    ("pool", {"pool"}),
    ("texts made samples", {"corpus"}),
    ("sources", {"sources"}),
    ("modalities", {"modalities"}),
    ("pipeline", {"pipeline"}),
    ("prepare", {"prepare"}),
]
DATA_LEVEL = {part: i for i, (_, parts) in enumerate(DATA_LAYERS) for part in parts}


def part_of(module: str, package: str = "data") -> str | None:
    """The folder (or module) directly inside trainforge.<package> a module is in: data.text.codec -> text."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == package else None


def part_graph(graph: dict[str, set[str]], package: str = "data") -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = part_of(module, package)
        if here is None:
            continue
        parts.setdefault(here, set()).update(t for t in map(lambda x: part_of(x, package), targets)
                                             if t is not None and t != here)
    return parts


def test_every_part_of_data_has_a_layer():
    unknown = sorted(p for p in part_graph(import_graph()) if p not in DATA_LEVEL)
    assert not unknown, f"put these in DATA_LAYERS: {unknown}"


def test_no_cycles_between_the_folders_of_data():
    cycles = find_cycles(part_graph(import_graph()))
    assert not cycles, "data/ folders importing each other: " + "; ".join(" -> ".join(c) for c, _ in cycles)


def test_imports_inside_data_point_down_only():
    graph = import_graph()
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                    if part_of(m) is not None and part_of(t) is not None
                    and DATA_LEVEL.get(part_of(t), -1) > DATA_LEVEL.get(part_of(m), len(DATA_LAYERS)))
    assert not upward, f"{len(upward)} import(s) inside data/ point up a layer:\n" + "\n".join(upward)


def test_the_data_check_sees_a_planted_cycle():
    """The cycle issue 51 found (text/tokenize -> formats/token_shards -> text/codec), planted again: caught."""
    graph = {"trainforge.data.text.tokenize": {"trainforge.data.formats.token_shards"},
             "trainforge.data.formats.token_shards": {"trainforge.data.text.codec"},
             "trainforge.data.text.codec": set()}
    assert find_cycles(part_graph(graph)) and not find_cycles(folder_graph(graph))  # the top-level check misses it
    assert DATA_LEVEL["formats"] > DATA_LEVEL["text"]  # and the layer check names text/tokenize's import as upward
