"""data.source: chat — conversations rendered with a chat template, loss on the assistant turns, packed windows
whose position ids restart per conversation, the tokenizer and template stored with the run."""
from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
import torch
from tiny_models import save_tiny_llama

import trainforge
from trainforge.data import build_data
from trainforge.data.text.chat_templates import TEMPLATES
from trainforge.data.summary import summarize

BASE = ["data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none"]
ALL_TRAIN = ["data.val_fraction=0", "data.test_fraction=0"]
# the tokenizer's own template: a role line, the content, eos as the end of each turn
OWN_TEMPLATE = ("{% for m in messages %}{{ m['role'] + '\n' + m['content'] }}{{ eos_token }}{% endfor %}"
                "{% if add_generation_prompt %}{{ 'assistant\n' }}{% endif %}")
TWO_TURNS = [
    {"role": "system", "content": "the fruit is yellow"},
    {"role": "user", "content": "red apple and green grape"},
    {"role": "assistant", "content": "the banana is yellow"},
    {"role": "user", "content": "alpha beta gamma"},
    {"role": "assistant", "content": "delta epsilon zeta eta"},
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """No chat template; chatml's markers are no tokens of its own (tokenized as text)."""
    return save_tiny_llama(tmp_path_factory.mktemp("llama") / "plain")


@pytest.fixture(scope="module")
def llama_chatml(tmp_path_factory):
    """No chat template, but <|im_start|> and <|im_end|> are special tokens of the tokenizer."""
    from transformers import AutoTokenizer

    path = save_tiny_llama(tmp_path_factory.mktemp("llama") / "chatml")
    tok = AutoTokenizer.from_pretrained(path)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama_own(tmp_path_factory):
    return save_tiny_llama(tmp_path_factory.mktemp("llama") / "own", chat_template=OWN_TEMPLATE)


def write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def chat_cfg(path, model, *extra):
    return trainforge.load_config(None, [*BASE, "data.source=chat", f"data.path={path}", "data.tokenizer=model",
                                         "model.name=hf", f"model.args={{pretrained: {model}}}", *extra])


def runs(mask):
    """The index runs of consecutive True positions."""
    out, current = [], []
    for i, m in enumerate(mask.tolist()):
        if m:
            current.append(i)
        elif current:
            out.append(current)
            current = []
    return out + ([current] if current else [])


@pytest.mark.parametrize("model, end_of_turn", [("llama_chatml", "<|im_end|>"), ("llama_own", "</s>")])
def test_loss_is_on_the_assistant_contents_and_their_end_of_turn_tokens_only(model, end_of_turn, request, tmp_path):
    from transformers import AutoTokenizer

    path = request.getfixturevalue(model)
    tok = AutoTokenizer.from_pretrained(path)
    data_file = write(tmp_path / "chat.jsonl", [{"messages": TWO_TURNS}])
    data = build_data(chat_cfg(data_file, path, "data.args.seq_len=128", *ALL_TRAIN).data, seed=0)
    x, y = data.train[0]
    assert x.shape == (2, 128) and x.dtype == y.dtype == torch.int64 and y.shape == (128,)
    assert data.info.input_shape == (2, 128) and data.info.pad_id == tok.eos_token_id  # no pad token: eos
    assert data.info.vocab_size == len(tok) and data.info.task == "lm"

    answers = [m["content"] for m in TWO_TURNS if m["role"] == "assistant"]
    eot = tok.convert_tokens_to_ids(end_of_turn)
    expected = sum(len(tok(a, add_special_tokens=False)["input_ids"]) + 1 for a in answers)  # + one end-of-turn each
    labelled = y != -100
    assert int(labelled.sum()) == expected
    spans = runs(labelled)
    assert len(spans) == 2
    for span, answer in zip(spans, answers):
        ids = y[span].tolist()
        assert ids[-1] == eot and tok.decode(ids, skip_special_tokens=True) == answer
        assert ids == x[0, [t + 1 for t in span]].tolist()  # the next token's id, the standard causal shift

    everything = build_data(chat_cfg(data_file, path, "data.args.seq_len=128", "data.args.train_on=all",
                                     *ALL_TRAIN).data, seed=0)
    x_all, y_all = everything.train[0]
    template = OWN_TEMPLATE if model == "llama_own" else TEMPLATES["chatml"]
    text = tok.apply_chat_template(TWO_TURNS, chat_template=template, tokenize=False)
    real = len(tok(text, add_special_tokens=False)["input_ids"])
    assert torch.equal(x_all, x) and x[0, :real].tolist() == tok(text, add_special_tokens=False)["input_ids"]
    assert int((y_all != -100).sum()) == real - 1  # every real token but the first is a label; padding never
    assert torch.equal(x[1], torch.arange(128))  # unpacked: one plain sequence, padding keeps counting
    share = everything.report["chat"]["loss_token_share"]
    assert share == round((real - 1) / real, 4) and data.report["chat"]["loss_token_share"] == round(expected / real, 4)


def conversations(n):
    """n distinct two-message conversations of 1-4 and 1-3 words."""
    words = "alpha beta gamma delta red green blue apple banana cherry grape lemon".split()

    def text(start, count):
        return " ".join(words[(start + k) % len(words)] for k in range(count))

    return [{"messages": [{"role": "user", "content": f"{i} {text(i, 1 + i % 4)}"},
                          {"role": "assistant", "content": text(2 * i, 1 + i % 3)}]} for i in range(n)]


def pairs(dataset, pad_id):
    """The (token, label) pairs of every window, padding left out."""
    out = Counter()
    for i in range(len(dataset)):
        x, y = dataset[i]
        out.update((t, l) for t, l in zip(x[0].tolist(), y.tolist()) if (t, l) != (pad_id, -100))
    return out


def test_packing_restarts_positions_per_conversation_and_never_labels_across_one(llama_chatml, tmp_path):
    data_file = write(tmp_path / "chat.jsonl", conversations(16))
    args = [*ALL_TRAIN, "data.args.seq_len=96"]
    plain = build_data(chat_cfg(data_file, llama_chatml, *args).data, seed=0)
    packed = build_data(chat_cfg(data_file, llama_chatml, *args, "data.args.pack=true").data, seed=0)
    assert len(plain.train) == 16 and len(packed.train) < 16
    assert packed.report["rows_kept"] == 16 and packed.report["chat"]["windows"]["train"] == len(packed.train)
    starts_per_window = []
    for i in range(len(packed.train)):
        x, y = packed.train[i]
        ids, pos = x[0], x[1]
        starts = torch.nonzero(pos == 0).flatten().tolist()
        starts_per_window.append(len(starts))
        assert starts[0] == 0
        for a, b in zip(starts, starts[1:]):
            assert torch.equal(pos[a:b], torch.arange(b - a))  # 0..n-1 within each conversation
            assert y[b - 1] == -100  # the last token of a conversation predicts nothing
        for t in torch.nonzero(y != -100).flatten().tolist():
            assert pos[t + 1] == pos[t] + 1 and y[t] == ids[t + 1]  # a label only within its conversation
    assert max(starts_per_window) >= 2 and sum(starts_per_window) == 16
    pad = plain.info.pad_id
    assert pairs(packed.train, pad) == pairs(plain.train, pad)
    again = build_data(chat_cfg(data_file, llama_chatml, *args, "data.args.pack=true").data, seed=0)
    assert all(torch.equal(packed.train[i][0], again.train[i][0]) for i in range(len(packed.train)))


def test_both_formats_render_with_the_chosen_template_and_bad_lines_are_dropped_and_counted(llama, llama_own,
                                                                                            tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama)
    records = [
        {"messages": [{"role": "user", "content": "red apple"}, {"role": "assistant", "content": "green grape"}]},
        {"instruction": "name a fruit", "input": "yellow", "output": "the banana"},
        "not json at all",
        {"text": "no messages"},
        {"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]},
        {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "y"}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"instruction": "no output"},
        {"messages": [{"role": "user", "content": "alpha " * 400}, {"role": "assistant", "content": "too long"}]},
    ]
    data_file = write(tmp_path / "chat.jsonl", records)

    def windows(model, *extra):
        data = build_data(chat_cfg(data_file, model, *ALL_TRAIN, "data.args.seq_len=200", *extra).data, seed=0)
        texts = [tok.decode(data.train[i][1][data.train[i][1] != -100].tolist()) for i in range(len(data.train))]
        full = [tok.decode(data.train[i][0][0].tolist()) for i in range(len(data.train))]
        return data, texts, full

    data, labelled, full = windows(llama)  # no template of its own: chatml, its markers tokenized as text
    assert data.report["chat"]["template"] == "chatml" and len(data.train) == 2
    assert sorted(labelled) == ["green grape<|im_end|>", "the banana<|im_end|>"]
    assert any(f.startswith("<|im_start|>user\nred apple<|im_end|>\n<|im_start|>assistant\ngreen grape<|im_end|>")
               for f in full)
    assert any(f.startswith("<|im_start|>user\nname a fruit\n\nyellow<|im_end|>\n<|im_start|>assistant\nthe banana")
               for f in full)
    report = data.report
    assert report["rows_read"] == 9 and report["rows_kept"] == 2
    assert report["dropped"] == {"duplicate": 0, "corrupt": 6, "empty_text": 0, "too_long": 1}
    assert report["dropped_examples"]["too_long"] == ["line 9"] and len(report["dropped_examples"]["corrupt"]) == 5
    assert sum(report["chat"]["tokens_per_conversation"].values()) == 3  # the too-long one is counted there too
    line = summarize(report).line
    assert "corrupt 6, too_long 1" in line and "loss on" in line and "% of" in line

    _, _, full = windows(llama, "data.args.template=alpaca")
    assert any(f.startswith("### Instruction:\nname a fruit\n\n### Input:\nyellow\n\n### Response:\nthe banana</s>")
               for f in full)
    assert any(f.startswith("### Instruction:\nred apple\n\n### Response:\ngreen grape</s>") for f in full)
    data, labelled, full = windows(llama, "data.args.template=llama3")
    assert any(f.startswith("<s><|start_header_id|>user<|end_header_id|>\n\nred apple<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\ngreen grape<|eot_id|>") for f in full)
    assert sorted(labelled) == ["green grape<|eot_id|>", "the banana<|eot_id|>"]  # content + end-of-turn, as text

    data, labelled, full = windows(llama_own)  # auto: the tokenizer's own template
    assert data.report["chat"]["template"] == "tokenizer" and any(f.startswith("user\nred apple</s>") for f in full)
    with pytest.warns(UserWarning, match="data.args.template: chatml replaces the tokenizer's own"):
        data, _, _ = windows(llama_own, "data.args.template=chatml")
    assert data.report["chat"]["template"] == "chatml"


@pytest.mark.parametrize("extra, field", [
    (["data.tokenizer=bpe"], "data.tokenizer"),
    (["data.tokenizer=null"], "data.tokenizer"),
    (["data.args.template=vicuna"], "data.args.template"),
    (["data.args.train_on=user"], "data.args.train_on"),
    (["data.args.seq_len=0"], "data.args.seq_len"),
])
def test_a_wrong_tokenizer_or_argument_is_one_line_naming_the_field(extra, field, llama, tmp_path):
    data_file = write(tmp_path / "chat.jsonl", conversations(4))
    with pytest.raises(trainforge.UserError) as err:
        build_data(chat_cfg(data_file, llama, *extra).data, seed=0)
    message = str(err.value)
    assert message.startswith(field + ":") and "\n" not in message


def test_the_stored_tokenizer_and_template_give_identical_tensors_without_the_model(llama_own, tmp_path):
    moved = tmp_path / "model"
    shutil.copytree(llama_own, moved)
    data_file = write(tmp_path / "chat.jsonl", conversations(20))
    cfg = chat_cfg(data_file, moved, "data.args.seq_len=64", "data.args.pack=true")
    first = build_data(cfg.data, seed=3)
    assert first.preprocess["chat_template"] == OWN_TEMPLATE and first.preprocess["tokenizer"] == "model"
    shutil.rmtree(moved)
    again = build_data(cfg.data, seed=3, stored=first.preprocess)
    assert again.info == first.info and again.report["splits"] == first.report["splits"]
    for split in ("train", "val", "test"):
        a, b = getattr(first, split), getattr(again, split)
        assert len(a) == len(b) > 0
        for i in range(len(a)):
            assert torch.equal(a[i][0], b[i][0]) and torch.equal(a[i][1], b[i][1])
    with pytest.raises(trainforge.UserError, match="data.from_model.source"):
        build_data(cfg.data, seed=3)  # without the stored record it would need the model's files
