"""data.source: hf_datasets — local parquet / jsonl / csv / arrow files read with Hugging Face `datasets`: a text column
as a language-modelling corpus (token shards), or text + label columns as text classification. No hub."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainforge.config import load_config
from trainforge.data import build_data
from trainforge.data.text.tokenizer import TextTokenizer
from trainforge.errors import UserError
from tiny_models import corpus, save_tiny_bert


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path / "home"))


def cfg(path, *extra: str):
    return load_config(None, ["data.source=hf_datasets", f"data.path={path}", "data.augment.rotation_deg=0",
                              "data.augment.crop_scale=null", "data.val_fraction=0.1", "data.test_fraction=0.1",
                              *extra]).data


def test_lm_corpus_from_a_folder_of_parquet_files_is_its_text_column_in_order(tmp_path):
    texts = corpus(300)
    folder = tmp_path / "parquet"
    folder.mkdir()
    for i in range(3):  # one task of the tokenizing pool per file
        pq.write_table(pa.table({"id": list(range(100)), "body": texts[i * 100:(i + 1) * 100]}),
                       folder / f"part-{i}.parquet")
    bundle = build_data(cfg(folder, "data.args={text_column: body, block_size: 32}"), seed=0)
    assert bundle.info.task == "lm" and bundle.info.vocab_size == 256 and bundle.report["split_method"] == "contiguous"
    stream = "".join(t + "\n" for t in texts).encode()  # raw bytes: a row a line
    shards = bundle.report["token_shards"]
    assert shards["tokens"] == len(stream) and shards["corpus_files"] == 3
    ordered = [bundle.train[(0, i)] for i in range(len(bundle.train))] + [bundle.val[i] for i in range(len(bundle.val))]
    joined = b"".join(bytes(x.tolist()) + bytes(y[-1:].tolist()) for x, y in ordered)
    assert joined == stream[:len(joined)]
    assert build_data(cfg(folder, "data.args={text_column: body, block_size: 32}"), seed=0) \
        .report["token_shards"]["reused"]


def test_lm_corpus_with_a_bpe_ends_each_row_with_eos(tmp_path):
    texts = corpus(200)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    bundle = build_data(cfg(path, "data.tokenizer=bpe", "data.tokenizer_args.vocab_size=300",
                            "data.args={block_size: 16}"), seed=0)
    tok = TextTokenizer.from_preprocess(bundle.preprocess)
    expected = tok.encode_stream(texts)
    assert bundle.report["token_shards"]["tokens"] == len(expected)
    x, y = bundle.val[0]
    start = len(bundle.train) * 17
    assert np.array_equal(x.numpy(), expected[start:start + 16]) and np.array_equal(y.numpy(), expected[start + 1:start + 17])


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "csv"])
def test_classification_from_text_and_label_columns_like_jsonl(tmp_path, kind):
    rows = [{"review": t, "stars": "good" if "apple" in t else "bad"} for t in corpus(120)]
    rows[3]["review"] = "   "  # empty_text
    rows[5]["stars"] = None  # bad_label
    path = tmp_path / f"reviews.{kind}"
    if kind == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text("review,stars\n" + "".join(f"{r['review']},{r['stars'] or ''}\n" for r in rows))
    bundle = build_data(cfg(path, "data.args={text_column: review, label_column: stars, seq_len: 24}"), seed=0)
    report = bundle.report
    assert bundle.info.task == "classification" and bundle.info.class_names == ("bad", "good")
    assert report["rows_read"] == 120 and report["rows_kept"] == 118
    assert report["dropped"]["empty_text"] == 1 and report["dropped"]["bad_label"] == 1
    assert report["dropped_examples"]["bad_label"] == [f"reviews.{kind} row 6"]
    assert bundle.preprocess["tokenizer"] == "bytes" and sum(report["splits"].values()) == 118
    x, y = bundle.test[0]
    assert x.shape == (24,) and int(y) in (0, 1)


def test_classification_with_the_models_tokenizer(tmp_path):
    bert = save_tiny_bert(tmp_path / "bert", num_labels=2)
    path = tmp_path / "reviews.parquet"
    pq.write_table(pa.table({"text": corpus(60), "label": [i % 2 for i in range(60)]}), path)
    data = load_config(None, ["data.source=hf_datasets", f"data.path={path}", "data.args={label_column: label, "
                              "seq_len: 16}", "data.tokenizer=model", "model.name=hf", "data.augment.rotation_deg=0",
                              "data.augment.crop_scale=null",
                              f"model.args={{pretrained: {bert}}}"]).data
    bundle = build_data(data, seed=0)
    assert bundle.preprocess["tokenizer"] == "model" and bundle.info.class_names == ("0", "1")
    assert bundle.train[(0, 0)][0].shape == (16,)


def test_bad_columns_paths_and_names_are_one_line_errors(tmp_path, monkeypatch):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"body": ["x y z"] * 10}), path)
    with pytest.raises(UserError, match=r"data.args.text_column: .* has no column 'text'; its columns: body"):
        build_data(cfg(path), seed=0)
    with pytest.raises(UserError, match=r"data.args.label_column: .* has no column 'stars'; its columns: body"):
        build_data(cfg(path, "data.args={text_column: body, label_column: stars}"), seed=0)
    (tmp_path / "mixed").mkdir()
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "mixed" / "a.parquet")
    (tmp_path / "mixed" / "b.csv").write_text("text\nb\n")
    with pytest.raises(UserError, match=r"data.path: .* mixes formats \(csv, parquet\)"):
        build_data(cfg(tmp_path / "mixed"), seed=0)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(UserError, match=r"data.path: .*notes.txt is not a .parquet/.arrow/.jsonl/.json/.csv file"):
        build_data(cfg(tmp_path / "notes.txt"), seed=0)
    with pytest.raises(UserError, match=r"data.args.seq_lenn: unknown argument"):
        build_data(cfg(path, "data.args={seq_lenn: 3}"), seed=0)
    # a name that is no local path: the Hugging Face cache only (HF_HUB_OFFLINE is set for the tests), never the hub
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError, match=r"data.path: 'someone/no-such-dataset' is neither a local file or folder "
                                        r"nor a dataset in the Hugging Face cache.*HF_HUB_OFFLINE"):
        build_data(cfg("someone/no-such-dataset"), seed=0)
