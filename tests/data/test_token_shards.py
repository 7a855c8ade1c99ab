"""Token shards (data/formats/token_shards.py) and `trainforge data prepare`: a language-modelling corpus tokenized
once into memory-mapped shards, reused by every later run, prepared again when a file changes, once for two
processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import trainforge
from trainforge.config import load_config
from trainforge.data import build_data
from trainforge.data.formats import token_shards as shards_mod
from trainforge.data.prepare import prepare_data
from trainforge.data.formats.token_shards import TextFiles, TokenShards, prepare_shards, read_index
from trainforge.data.text.codec import RawBytes, Subword
from trainforge.data.text.tokenizer import TextTokenizer, train_bpe
from trainforge.errors import UserError
from tiny_models import corpus, save_tiny_llama

SRC = Path(trainforge.__file__).resolve().parents[1]  # the tree under test, for the CLI subprocesses


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def write_docs(folder: Path, n_files: int = 3, lines: int = 300) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    texts = corpus(n_files * lines)
    files = []
    for i in range(n_files):
        path = folder / f"doc{i}.txt"
        path.write_text("\n".join(texts[i * lines:(i + 1) * lines]) + "\n")
        files.append(path)
    return files


def lm_cfg(path: Path, *extra: str):
    return load_config(None, ["data.source=textfile", f"data.path={path}", "data.args.block_size=16",
                              "data.val_fraction=0.1", "data.test_fraction=0.1", "data.augment.rotation_deg=0",
                              "data.augment.crop_scale=null", "model.name=gpt", *extra])


def test_byte_shards_hold_the_corpus_in_order_across_shards_and_are_reused(tmp_path):
    files = write_docs(tmp_path / "docs")
    stream = b"".join(f.read_bytes() for f in files)
    corpus_ = TextFiles.of(files, None, "docs")
    index = prepare_shards(corpus_, RawBytes(), shard_bytes=10_000, workers=2)  # a pool of 2, files cut in pieces
    assert not index.reused and len(index.shard_files) > len(files) and index.dtype == "uint8"
    shards = TokenShards(index)
    assert shards.tokens == len(stream) == index.corpus_bytes
    assert bytes(shards.read(0, shards.tokens).astype(np.uint8)) == stream
    boundary = int(index.shard_tokens[0])  # a window that straddles two shards
    assert bytes(shards.read(boundary - 5, boundary + 5).astype(np.uint8)) == stream[boundary - 5:boundary + 5]
    again = prepare_shards(corpus_, RawBytes(), shard_bytes=10_000)
    assert again.reused and again.directory == index.directory


def test_subword_shards_match_the_tokenizers_stream_and_use_uint16(tmp_path):
    files = write_docs(tmp_path / "docs")
    tok = train_bpe(corpus(200), vocab_size=300, min_frequency=2)
    index = prepare_shards(TextFiles.of(files, None, "docs"), Subword.of(tok), shard_bytes=7_000, workers=2)
    assert index.dtype == "uint16" and index.documents == len(files)
    expected = tok.encode_stream([f.read_text() for f in files])  # cut at line ends: the same tokens, eos per file
    assert np.array_equal(TokenShards(index).read(0, index.tokens), expected)
    assert (index.directory / "tokenizer.json").read_text() == tok.files["tokenizer.json"]


def test_model_tokenizer_corpus_is_prepared_once_and_reused_by_the_next_build(tmp_path):
    llama = save_tiny_llama(tmp_path / "llama")
    files = write_docs(tmp_path / "docs")
    cfg = lm_cfg(tmp_path / "docs", "data.tokenizer=model", "model.name=hf", f"model.args={{pretrained: {llama}}}")
    first = build_data(cfg.data, seed=0)
    shards = first.report["token_shards"]
    assert not shards["reused"] and shards["dtype"] == "uint16" and shards["corpus_files"] == len(files)
    tok = TextTokenizer.from_preprocess(first.preprocess)
    stream = tok.encode_stream([f.read_text() for f in files])
    assert first.report["tokenizer"]["corpus_tokens"] == len(stream) == shards["tokens"]
    x, y = first.train[(0, 1)]
    assert torch.equal(x, torch.from_numpy(stream[17:33])) and torch.equal(y, torch.from_numpy(stream[18:34]))
    second = build_data(cfg.data, seed=0)
    assert second.report["token_shards"]["reused"] and second.report["token_shards"]["directory"] == shards["directory"]


def test_bpe_is_trained_once_on_the_train_text_and_resume_reuses_its_shards(tmp_path, monkeypatch):
    write_docs(tmp_path / "docs")
    cfg = lm_cfg(tmp_path / "docs", "data.tokenizer=bpe", "data.tokenizer_args.vocab_size=300")
    first = build_data(cfg.data, seed=0)
    trained = []
    monkeypatch.setattr("trainforge.data.corpus.tokenize.train_bpe", lambda *a, **k: trained.append(1))
    again = build_data(cfg.data, seed=0)  # the BPE of this corpus and settings is kept: not trained again
    resumed = build_data(cfg.data, seed=0, stored=first.preprocess)  # resume: the run's stored tokenizer
    assert not trained
    assert again.preprocess["tokenizer_files"] == first.preprocess["tokenizer_files"]
    assert again.report["token_shards"]["reused"] and resumed.report["token_shards"]["reused"]
    assert resumed.report["token_shards"]["directory"] == first.report["token_shards"]["directory"]


def test_a_changed_corpus_file_is_prepared_again(tmp_path):
    files = write_docs(tmp_path / "docs")
    cfg = lm_cfg(tmp_path / "docs")
    before = build_data(cfg.data, seed=0).report["token_shards"]
    with files[1].open("a") as f:
        f.write("one more line\n")
    after = build_data(cfg.data, seed=0).report["token_shards"]
    assert not after["reused"] and after["directory"] != before["directory"]
    assert after["tokens"] == before["tokens"] + len("one more line\n")


def test_a_crash_mid_prepare_leaves_nothing_a_later_run_trusts(tmp_path, monkeypatch):
    files = write_docs(tmp_path / "docs")
    corpus_ = TextFiles.of(files, None, "docs")
    real = shards_mod.tokenize_task
    calls = []

    def crash_on_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process dies between two shards
        return real(*args, **kwargs)

    monkeypatch.setattr(shards_mod, "tokenize_task", crash_on_second)
    with pytest.raises(KeyboardInterrupt):
        prepare_shards(corpus_, RawBytes(), shard_bytes=10_000, workers=1)
    final = shards_mod.shard_directory(corpus_, RawBytes())
    assert not final.exists() and not list(final.parent.glob(f".{final.name}.tmp-*"))
    monkeypatch.setattr(shards_mod, "tokenize_task", real)
    # a SIGKILL leaves its temporary directory behind, and a damaged shard is not trusted either
    (final.parent / f".{final.name}.tmp-99999").mkdir()
    index = prepare_shards(corpus_, RawBytes(), shard_bytes=10_000, workers=1)
    assert not index.reused and not list(final.parent.glob(f".{final.name}.tmp-*"))
    with (final / index.shard_files[0]).open("r+b") as f:
        f.truncate(100)
    assert read_index(final) is None
    rebuilt = prepare_shards(corpus_, RawBytes(), shard_bytes=10_000, workers=1)
    assert not rebuilt.reused and read_index(final) is not None


def cli(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.Popen([sys.executable, "-m", "trainforge", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def test_data_prepare_cli_two_processes_at_once_tokenize_once(tmp_path, home):
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(corpus(2000)) * 20)  # ~2 MB
    args = ["data", "prepare", "charlm_gpt", "data.args.corpus=null", f"data.path={corpus_file}", "--json"]
    procs = [cli(*args) for _ in range(2)]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-2000:]
        results.append(json.loads(stdout))
    assert sorted(r["reused"] for r in results) == [False, True]  # one tokenized, the other waited and reused
    assert results[0]["directory"] == results[1]["directory"]
    assert str(home) in results[0]["directory"] and results[0]["tokens"] == corpus_file.stat().st_size
    assert len([d for d in (home / "tokens").iterdir() if d.is_dir()]) == 1
    import trainforge.data.formats.token_shards as imported  # the subprocesses ran this tree's code
    assert Path(imported.__file__).resolve().is_relative_to(SRC)

    rebuilt = cli(*args, "--rebuild")
    stdout, stderr = rebuilt.communicate(timeout=300)
    assert rebuilt.returncode == 0 and json.loads(stdout)["reused"] is False, stderr[-2000:]
    assert "token shards: tokenizing" in stderr


def test_data_prepare_refuses_what_it_cannot_prepare(tmp_path):
    with pytest.raises(UserError, match=r"data.source: 'digits' gives no language-modelling corpus"):
        prepare_data(load_config(None, []).data, seed=0)
    write_docs(tmp_path / "docs")
    with pytest.raises(UserError, match=r"--format: unknown data format 'parquet'; choose one of: tokens"):
        prepare_data(lm_cfg(tmp_path / "docs").data, seed=0, data_format="parquet")
    bad = cli("data", "prepare", "charlm_gpt", "data.args.corpus=null", f"data.path={tmp_path / 'nothing'}")
    _, stderr = bad.communicate(timeout=120)
    assert bad.returncode == 2 and "data.path:" in stderr and "Traceback" not in stderr


def test_an_index_naming_another_dtype_or_a_file_elsewhere_is_not_read(tmp_path):
    """Issue 40: a token shard index is read only as trainforge writes it: an unsigned integer dtype it chooses
    (never object or float), and shard files of its own directory."""
    import json as json_module

    import numpy as np

    from trainforge.data.formats.token_shards import INDEX_FILE, read_index

    (tmp_path / "shard-00000.bin").write_bytes(np.arange(8, dtype=np.uint16).tobytes())
    good = {"format": "trainforge-tokens", "dtype": "<u2", "tokens": 8, "shards": [{"file": "shard-00000.bin",
            "tokens": 8}], "corpus_bytes": 1, "corpus_files": 1, "documents": 1, "tokenizer": {}, "prepared_s": 0.1}
    from trainforge.data.formats import token_shards

    good["format"] = token_shards.FORMAT
    (tmp_path / INDEX_FILE).write_text(json_module.dumps(good))
    assert read_index(tmp_path) is not None
    for bad in ({"dtype": "|O"}, {"dtype": "<f2"}, {"shards": [{"file": "../shard-00000.bin", "tokens": 8}]}):
        (tmp_path / INDEX_FILE).write_text(json_module.dumps({**good, **bad}))
        assert read_index(tmp_path) is None, bad
