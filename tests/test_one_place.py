"""Each decision has one implementation (issues 13 and 27): the run's setup, the largest micro-batch that fits,
precision, the device, the pre-flight, the OOM shrink rule, atomic writes, the CPU count. A second copy of any of
them would drift from the first."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "trainforge"


@functools.lru_cache(maxsize=None)
def _trees() -> dict[str, ast.AST]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(SRC.rglob("*.py"))}


def _texts() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text(encoding="utf-8") for p in sorted(SRC.rglob("*.py"))}


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


def test_the_cpu_count_is_read_in_one_place():
    """os.cpu_count() is the machine's, not what this process may use (taskset, a cpuset, Slurm): every pool and every
    thread count asks available_cpus."""
    readers = sorted(path for path, text in _texts().items()
                     if re.search(r"\bcpu_count\(\)|sched_getaffinity\(", text))
    assert readers == ["hardware/cpus.py"], readers


def test_only_the_one_search_walks_the_candidate_micro_batches():
    assert callers("candidate_micro_batches") == {"planning/memory.py"}
    assert callers("largest_fitting") == {"planning/auto.py", "planning/plan.py"}  # auto (train, jobs) and plan
    assert callers("auto_micro_batch") == {"training/setup.py"}  # the train run and the job admission resolve


def test_bf16_support_is_only_read_to_resolve_precision():
    assert callers("supports_bf16") <= {"training/setup.py", "training/evaluate.py"}
    assert callers("resolve_precision") == {"training/setup.py", "training/evaluate.py", "planning/plan.py"}
    assert callers("shrink_micro_batch") == {"training/setup.py"}


ACCELERATORS = ("cuda", "mps", "xpu", "npu")


def test_the_device_is_decided_in_one_function():
    """`hardware.device.resolve_device` decides which device a process computes on, for a run, a process of a group,
    evaluation, generation, calibration, the planner's own step and the job admission; nothing else names an
    accelerator device or asks whether one is there (but the slot inventory and the RNG state, which read them)."""
    assert definitions("resolve_device") == ["hardware/device.py"]
    assert callers("resolve_device") == {"engine/env.py", "training/evaluate.py", "training/generate.py",
                                         "training/calibrate.py", "planning/plan.py", "jobs/admission.py",
                                         "compression/torchao_quant.py"}
    named = set()
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            f = node.func
            if f.attr == "device" and node.args and isinstance(node.args[0], ast.Constant) \
                    and str(node.args[0].value).startswith(ACCELERATORS):
                named.add(path)  # torch.device("cuda", ...)
            if f.attr == "is_available" and isinstance(f.value, ast.Attribute) and f.value.attr in ACCELERATORS:
                named.add(path)  # torch.cuda.is_available()
    assert named <= {"hardware/device.py", "jobs/slots.py", "engine/rng.py"}, named


def test_precision_is_interpreted_in_one_function():
    """`train.precision` is read only to be handed to `resolve_precision`, by the three that resolve it."""
    readers = {path for path, text in _texts().items() if path != "engine/precision.py"  # its docstring
               if re.search(r"\b(?:train|tc)\.precision\b(?![:=])", text)}
    assert readers <= callers("resolve_precision"), readers - callers("resolve_precision")


def test_the_pre_flight_is_one_function_every_command_uses():
    """Building a run's data and model to check it (train, the torchrun launcher, plan, tune, the job admission)
    is `engine.preflight.preflight`; none of them builds the data or the model itself."""
    assert definitions("preflight") == ["engine/preflight.py"]
    users = {"training/run.py", "launch/torchrun.py", "planning/plan.py", "tuning/api.py", "jobs/admission.py"}
    assert users <= callers("preflight")
    assert not users & callers("build_data"), users & callers("build_data")


def test_the_loop_reads_no_config():
    """fit() runs its RunSetup: everything it reads of the config was taken once by `resolve` (setup.loop)."""
    text = _texts()["training/loop.py"]
    assert not re.search(r"\b(?:cfg|tc)\.", text), re.findall(r".*\b(?:cfg|tc)\..*", text)
    assert not re.search(r"\bconfig\.\w", text.replace("inputs.config,", "")), re.findall(r".*\bconfig\.\w.*", text)


# The run and job directories' names (issue 39): spelled in layout.py alone. A file name is flagged where it builds a
# path (an operand of `/`, an argument of Path(), glob(), joinpath() ...); the checkpoint and metadata names wherever
# they appear as a string (f-string pieces included), docstrings and messages aside.
PATH_NAMES = {"final", "run", "tmp", "model.json", "sandbox.json", "step-"}
ALWAYS_NAMES = ("step-", ".tmp-step-", "model.json", "sandbox.json")
PATH_CALLS = {"Path", "PurePath", "glob", "rglob", "joinpath", "with_name", "removeprefix", "startswith"}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def layout_file_names() -> set[str]:
    """Every file name layout.py declares (config.yaml, job-config.yaml, eval.json ...)."""
    tree = ast.parse((SRC / "layout.py").read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and re.fullmatch(r"[\w.-]+\.(yaml|json|jsonl|html|png|txt|pt|safetensors)", n.value)}


def layout_names_spelled(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, string) of each place a run/job directory name is spelled outside layout.py's constants: a name in a
    path, a checkpoint or metadata name anywhere, and (issue 51) a layout file name after a folder in a string: the
    piece of an f-string that joins it (f"{folder}/config.yaml") or a shell variable's ("$run_dir/job-config.yaml")."""
    skip = _docstrings(tree)
    files = layout_file_names()
    joined = re.compile(r"(^|\$\{?\w+\}?)/(" + "|".join(map(re.escape, sorted(files))) + r")\b")
    in_path: set[int] = set()
    in_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            in_path |= {id(node.left), id(node.right)}
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in PATH_CALLS:
                in_path |= {id(a) for a in node.args}
        elif isinstance(node, ast.JoinedStr):
            in_fstring |= {id(v) for v in node.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            if ((id(node) in in_path and (text in PATH_NAMES or text in files)) or text.startswith(ALWAYS_NAMES)
                    or (id(node) in in_fstring and joined.match(text)) or re.search(r"\$\{?\w+\}?/", text)
                    and joined.search(text)):
                found.append((node.lineno, text))
    return sorted(found)


def test_run_and_job_directory_names_are_spelled_in_layout_alone():
    spelled = [f"{path}:{line}: {text!r}" for path, tree in _trees().items() if path != "layout.py"
               for line, text in layout_names_spelled(tree)]
    assert not spelled, "use trainforge.layout (RunDir, JobDir, step_dir_name, STEP_GLOB ...):\n" + "\n".join(spelled)


def test_the_name_check_sees_each_way_a_name_is_spelled():
    code = '''
run = job_dir / "run"
final = Path(run_dir, "final")
ckpt = root / f"step-{step:06d}"
found = root.glob("step-*")
step = int(name.removeprefix("step-"))
meta = path / "model.json"
fence = "sandbox.json"
mounted = f"{CONFIG_DIR}/config.yaml"
script = 'config_file="$run_dir/job-config.yaml"'
report = run_dir / "report.html"
'''
    assert sorted(line for line, _ in layout_names_spelled(ast.parse(code))) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    fine = '''
"""A docstring may say final/model.json and checkpoints/step-*."""
name: str = "run"
rows = {"run": label}
raise UserError("not a run directory, final/ or checkpoints/step-* directory")
'''
    assert layout_names_spelled(ast.parse(fine)) == []


def test_every_transformers_loader_is_told_whether_to_run_remote_code():
    """Issue 40: transformers asks on the terminal (and a piped `yes` answers) unless trust_remote_code is passed.
    Every from_pretrained / from_config call passes it, and every from_hub call (which always passes it) is given a
    loader, never called without the keyword reaching it."""
    missing = []
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("from_pretrained", "from_config", "for_model"):
                if node.func.attr == "for_model":
                    continue  # a config from a known model_type: no code to fetch
                if not any(k.arg == "trust_remote_code" for k in node.keywords):
                    missing.append(f"{path}:{node.lineno}")
    assert not missing, missing
    assert "kwargs[\"trust_remote_code\"] = trust_remote_code" in (SRC / "hub.py").read_text()
