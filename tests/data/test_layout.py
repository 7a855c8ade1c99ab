"""The data stage's layout (issue 27): tokenization in one place, a pipeline that asks its samples what they need,
and token shard workers without torch."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "trainforge"
TOKENIZING = {"AutoTokenizer", "PreTrainedTokenizerFast", "PreTrainedTokenizerBase"}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module, [a.name for a in node.names]))
    return found


def _tokenizes(module: str, names: list[str]) -> bool:
    return module.split(".")[0] == "tokenizers" or (module.startswith("transformers") and bool(TOKENIZING & set(names)))


def test_only_data_text_uses_the_tokenizer_libraries():
    users = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                   if any(_tokenizes(module, names) for module, names in _imports(p)))
    assert users and all(u.startswith("data/text/") for u in users), users


def test_the_pipeline_tests_no_samples_class():
    """build_data asks the samples (Samples.before_split, after_split, contiguous, in_memory) instead."""
    tree = ast.parse((PKG / "data" / "pipeline.py").read_text(encoding="utf-8"))
    tested = [ast.unparse(node.args[1]) for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"]
    assert tested == ["DataBundle"], tested  # only a custom source's finished bundle


def test_token_shard_workers_import_no_torch():
    code = ("import sys; import trainforge.data.formats.token_shards, trainforge.data.text.codec; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
