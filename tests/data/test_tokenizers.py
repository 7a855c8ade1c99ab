"""data.tokenizer: model | bpe — the pretrained model's own tokenizer or a BPE trained on the training split,
stored with the run and used again by eval, compress, predict and resume (never loaded or trained anew)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_models import corpus, save_tiny_bert, save_tiny_llama

import trainforge
from trainforge.compression.serving import modality_reader
from trainforge.data import build_data
from trainforge.data.text.tokenizer import TextTokenizer, train_bpe

BASE = ["data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none"]


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "texts.jsonl"
    texts = corpus(300)
    path.write_text("".join(json.dumps({"text": t, "label": int("apple" in t)}) + "\n" for t in texts))
    return path


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert") / "bert")


def cls_cfg(texts_file, *extra):
    return trainforge.load_config(None, [*BASE, "data.source=jsonl", f"data.path={texts_file}", "data.args.seq_len=12",
                                         *extra])


def test_model_tokenizer_is_the_pretrained_models_own_with_its_special_tokens_and_padding(texts_file, bert):
    from transformers import AutoTokenizer

    cfg = cls_cfg(texts_file, "data.tokenizer=model", "model.name=hf", f"model.args={{pretrained: {bert}}}")
    assert cfg.data.from_model.family == "hf" and cfg.data.from_model.source == str(bert)
    data = build_data(cfg.data, seed=0)
    reference = AutoTokenizer.from_pretrained(bert)
    x, _ = data.val[0]
    ids = [int(i) for i in x]
    pad = reference.pad_token_id
    assert data.info.pad_id == pad and data.info.vocab_size == len(reference)
    assert ids[0] == reference.cls_token_id and reference.sep_token_id in ids
    text = reference.decode([i for i in ids if i != pad], skip_special_tokens=True)
    again = reference(text, max_length=12, truncation=True, padding="max_length")["input_ids"]
    assert again == ids  # exactly what transformers' own tokenizer gives, truncation and padding included
    assert data.preprocess["tokenizer"] == "model" and "tokenizer.json" in data.preprocess["tokenizer_files"]


def test_bpe_is_trained_on_the_training_split_only_and_deterministic(texts_file, tmp_path):
    cfg = cls_cfg(texts_file, "data.tokenizer=bpe", "data.tokenizer_args.vocab_size=300")
    a, b = build_data(cfg.data, seed=0), build_data(cfg.data, seed=0)
    assert a.preprocess["tokenizer_files"] == b.preprocess["tokenizer_files"]
    assert torch.equal(a.train[0][0], b.train[0][0]) and a.info.pad_id == 0
    # exactly the BPE that the training split's texts alone give (none of val/test is seen), and not that of all
    texts = [json.loads(line)["text"] for line in texts_file.read_text().splitlines()]
    train_only = train_bpe([texts[i] for i in a.train.indices], vocab_size=300, min_frequency=2)
    everything = train_bpe(texts, vocab_size=300, min_frequency=2)
    assert a.preprocess["tokenizer_files"] == train_only.files != everything.files


def test_the_stored_tokenizer_is_used_even_when_the_model_directory_is_gone(texts_file, bert, tmp_path):
    """eval/compress/resume pass the stored record: the data is tokenized identically with no model files."""
    moved = tmp_path / "bert"
    shutil.copytree(bert, moved)
    cfg = cls_cfg(texts_file, "data.tokenizer=model", "model.name=hf", f"model.args={{pretrained: {moved}}}")
    first = build_data(cfg.data, seed=0)
    shutil.rmtree(moved)
    again = build_data(cfg.data, seed=0, stored=first.preprocess)
    assert torch.equal(first.test[3][0], again.test[3][0])
    with pytest.raises(trainforge.UserError, match="data.from_model.source"):
        build_data(cfg.data, seed=0)  # without the stored record it would have to load it: one line naming the field


def test_predict_tokenizes_with_the_stored_tokenizer_without_torch_or_transformers(texts_file, bert):
    data = build_data(cls_cfg(texts_file, "data.tokenizer=model", "model.name=hf",
                              f"model.args={{pretrained: {bert}}}").data, seed=0)
    meta = {"modality": "text", "input_shape": [12], "preprocess": data.preprocess}
    read = modality_reader({**meta, "modality": "text"}, artifact="model.onnx")
    line = corpus(1)[0]
    (name, ids), = list(read([str(_write(texts_file.parent / "one.txt", line))]))
    expected = TextTokenizer.from_preprocess(data.preprocess).encode_fixed([line], 12)[0]
    assert name == line and ids.tolist() == expected.tolist()


def _write(path, text):
    path.write_text(text + "\n")
    return path


def test_causal_lm_corpus_with_the_models_tokenizer_trains_and_resumes_with_it(tmp_path):
    llama = save_tiny_llama(tmp_path / "llama")
    (tmp_path / "corpus.txt").write_text("\n".join(corpus(200)))
    cfg = trainforge.load_config(None, [*BASE, "data.source=textfile", f"data.path={tmp_path / 'corpus.txt'}",
                                        "data.args.block_size=32", "data.tokenizer=model", "model.name=hf",
                                        f"model.args={{pretrained: {llama}}}", "train.max_steps=3",
                                        "train.global_batch_size=4", "train.micro_batch_size=4", "log.progress=false",
                                        "log.tensorboard=false", "log.report=false", "train.early_stopping=null", "name=lm"])
    data = build_data(cfg.data, seed=0)
    assert data.info.task == "lm" and data.info.vocab_size == 320 and data.preprocess["eos_id"] is not None
    run_dir = tmp_path / "run"
    trainforge.train(cfg, run_dir=run_dir)
    final = run_dir / "final"
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(final / "hf")  # final/hf has the tokenizer beside the weights
    assert tok.encode("apple banana", add_special_tokens=False) == \
        TextTokenizer.from_preprocess(data.preprocess).encode_stream(["apple banana"])[:-1].tolist()
    meta = json.loads((final / "model.json").read_text())
    assert meta["preprocess"]["tokenizer_files"] == data.preprocess["tokenizer_files"]
