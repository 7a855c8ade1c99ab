"""`trainforge generate`: text from a trained causal LM, with the run's stored tokenizer and transformers' own
generate (KV cache) for hf models, a small loop for the zoo's gpt. One tiny Llama run (2 steps) serves all tests;
its tokenizer has a chat template whose turns end with </s>."""
from __future__ import annotations

import json

import pytest
import torch
from tiny_models import corpus, save_tiny_llama

import trainforge
from trainforge.cli import main
from trainforge.errors import UserError
from trainforge.data.text import CHATML, StoredTokenizer, codec_for
from trainforge.training.generate import Detokenizer, generate

CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")
QUIET = ["log.progress=false", "log.tensorboard=false", "log.report=false", "train.early_stopping=null"]
TEXT = ["data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("generate")
    (root / "corpus.txt").write_text("\n".join(corpus(120)))
    llama = save_tiny_llama(root / "llama", chat_template=CHAT_TEMPLATE)
    cfg = trainforge.load_config(None, [*TEXT, *QUIET, "name=lm", "data.source=textfile",
                                        f"data.path={root / 'corpus.txt'}", "data.args.block_size=32",
                                        "data.tokenizer=model", "model.name=hf", f"model.args={{pretrained: {llama}}}",
                                        "train.max_steps=2", "train.checkpoint_every_steps=2",
                                        "train.global_batch_size=4", "train.micro_batch_size=4"])
    trainforge.train(cfg, run_dir=root / "run")
    return root / "run"


def reference_greedy(run, ids: list[int], n: int) -> list[int]:
    """transformers' own greedy generate on final/hf, nothing of trainforge in between."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "final" / "hf").eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n)
    return out[0, len(ids):].tolist()


def hf_tokenizer(run):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run / "final" / "hf")


def test_greedy_is_transformers_own_greedy_generate_token_for_token(run):
    result = generate(run, "apple banana", temperature=0, max_new_tokens=12)
    ids = hf_tokenizer(run).encode("apple banana", add_special_tokens=False)
    assert result.token_ids == reference_greedy(run, ids, 12)
    assert result.new_tokens == len(result.token_ids) > 0
    assert result.stopped == ("eos" if result.token_ids[-1] == 1 else "max_new_tokens")
    assert result.source == str(run / "final")


def test_the_same_seed_gives_the_same_text_and_the_streamed_pieces_are_the_text(run):
    pieces: list[str] = []
    a = generate(run, "the red", temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3, on_text=pieces.append)
    b = generate(run, "the red", temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3)
    c = generate(run, "the red", temperature=1.0, top_p=1.0, max_new_tokens=16, seed=4)
    assert a.token_ids == b.token_ids and a.text == b.text
    assert c.token_ids != a.token_ids  # a 2-step model samples almost uniformly over 320 tokens
    assert len(pieces) > 1 and "".join(pieces) == a.text
    assert a.text == hf_tokenizer(run).decode(a.token_ids, skip_special_tokens=True)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()  # what fixtures (training runs) wrote before
    try:
        main(["generate", *args])
        code = 0
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_streams_exactly_the_text_to_stdout_or_one_json_document(run, capsys):
    args = [str(run), "apple", "--temperature", "0.8", "--seed", "5", "--max-new-tokens", "10"]
    expected = generate(run, "apple", temperature=0.8, max_new_tokens=10, seed=5)
    code, out, err = cli(capsys, *args)
    assert code == 0 and out == expected.text and "tokens/s" in err
    code, out, _ = cli(capsys, *args, "--json")
    doc = json.loads(out)  # the whole of stdout is one document
    assert code == 0 and doc["text"] == expected.text and doc["new_tokens"] == expected.new_tokens
    assert doc["prompt"] == "apple" and doc["stopped"] in ("eos", "max_new_tokens") and doc["tokens_per_s"] > 0


def test_a_checkpoint_directory_generates_with_its_weights(run):
    step = run / "checkpoints" / "step-000002"
    assert step.is_dir()
    result = generate(step, "apple banana", temperature=0, max_new_tokens=8)
    assert result.source == str(step)
    final = generate(run / "final", "apple banana", temperature=0, max_new_tokens=8)
    assert result.token_ids == final.token_ids  # the last checkpoint holds the final weights


def test_chat_renders_the_prompt_with_the_tokenizer_chat_template(run):
    tok = hf_tokenizer(run)
    rendered = tok.apply_chat_template([{"role": "user", "content": "apple"}], tokenize=False,
                                       add_generation_prompt=True)
    assert rendered == "<s>user: apple</s>\n<s>assistant:"
    result = generate(run, "apple", chat=True, temperature=0, max_new_tokens=10)
    assert result.token_ids == reference_greedy(run, tok.encode(rendered, add_special_tokens=False), 10)
    assert result.token_ids != generate(run, "apple", temperature=0, max_new_tokens=10).token_ids


def test_chat_without_a_template_is_one_line_naming_the_fix(run):
    pre = json.loads((run / "final" / "model.json").read_text())["preprocess"]
    files = {name: text for name, text in pre["tokenizer_files"].items() if not name.endswith(".jinja")}
    config = json.loads(files["tokenizer_config.json"])
    config.pop("chat_template", None)
    files["tokenizer_config.json"] = json.dumps(config)
    with pytest.raises(UserError, match="no chat template.*drop --chat"):
        codec_for({**pre, "tokenizer_files": files}).chat("apple")


def test_a_chat_runs_stored_template_wins_and_its_end_of_turn_text_is_found(run):
    """A chat run stores the template it trained with (here chatml, whose <|im_end|> this tokenizer lacks as a
    token): --chat renders with it and stops on the marker's text."""
    pre = json.loads((run / "final" / "model.json").read_text())["preprocess"]
    ids, stop_ids, stop_text = codec_for({**pre, "chat_template": CHATML}).chat("apple")
    tok = hf_tokenizer(run)
    assert ids == tok.encode("<|im_start|>user\napple<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert (stop_ids, stop_text) == ((), "<|im_end|>")
    assert codec_for(pre).chat("apple")[1:] == ((1,), None)  # the tiny template ends its turns with </s>


def test_the_end_of_turn_text_ends_the_text_and_is_never_streamed():
    pieces: list[str] = []
    out = Detokenizer(lambda ids: "".join(map(chr, ids)), pieces.append, stop_text="<|im_end|>")
    for c in "hi <|im":
        out.push([ord(c)])
    assert "".join(pieces) == "hi " and not out.stopped  # "<|im" may start the marker: held back
    for c in "x <|im_end":
        out.push([ord(c)])
    assert "".join(pieces) == "hi <|imx " and not out.stopped
    out.push([ord("|")])
    out.push([ord(">")])
    assert out.stopped and out.finish() == "hi <|imx " == "".join(pieces)


def test_generation_stops_where_the_end_of_turn_text_is_generated(run, monkeypatch):
    """The transformers path checks the stop text after every token (a StoppingCriteria), not only at the end."""
    full = generate(run, "apple", chat=True, temperature=0, max_new_tokens=24)
    at = next(k for k in range(len(full.text) // 2, len(full.text) - 2)
              if "\ufffd" not in full.text[k:k + 2] and full.text.find(full.text[k:k + 2]) == k)
    stop = full.text[at:at + 2]
    monkeypatch.setattr(StoredTokenizer, "end_of_turn", lambda self: ((), stop))
    pieces: list[str] = []
    cut = generate(run, "apple", chat=True, temperature=0, max_new_tokens=24, on_text=pieces.append)
    assert cut.text == full.text[:at] == "".join(pieces) and cut.stopped == "eos"
    assert cut.token_ids == full.token_ids[:cut.new_tokens] and cut.new_tokens < full.new_tokens


@pytest.fixture(scope="module")
def classification_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("digits")
    cfg = trainforge.load_config(None, [*QUIET, "train.max_steps=1"])
    trainforge.train(cfg, run_dir=root / "run")
    return root / "run"


@pytest.mark.parametrize("case, args, message", [
    ("classification", [], "generate needs a causal language model run"),
    ("lm", ["--top-p", "0"], "--top-p: must be in (0, 1]"),
    ("lm", ["--temperature", "-1"], "--temperature: must be >= 0"),
    ("lm", ["--max-new-tokens", "0"], "--max-new-tokens: must be at least 1"),
    ("missing", [], "no such checkpoint or run directory"),
])
def test_bad_input_exits_2_with_one_line(request, capsys, tmp_path, case, args, message):
    path = {"classification": lambda: request.getfixturevalue("classification_run"),
            "lm": lambda: request.getfixturevalue("run"),
            "missing": lambda: tmp_path / "nowhere"}[case]()
    code, out, err = cli(capsys, str(path), "apple", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in " ".join(err.split())


def test_a_byte_level_gpt_run_generates_with_its_own_loop(tmp_path):
    (tmp_path / "corpus.txt").write_text("\n".join(corpus(40)))
    cfg = trainforge.load_config(None, [*TEXT, *QUIET, "data.source=textfile", f"data.path={tmp_path / 'corpus.txt'}",
                                        "data.args.block_size=16", "model.name=gpt",
                                        "model.args={n_layer: 1, n_head: 2, n_embd: 16}", "train.max_steps=1",
                                        "train.global_batch_size=4", "train.micro_batch_size=4"])
    trainforge.train(cfg, run_dir=tmp_path / "run")
    pieces: list[str] = []
    a = generate(tmp_path / "run", "apple", temperature=1.0, max_new_tokens=40, seed=1, on_text=pieces.append)
    b = generate(tmp_path / "run", "apple", temperature=1.0, max_new_tokens=40, seed=1)
    assert a.new_tokens == 40 and a.stopped == "max_new_tokens"  # no end-of-text token in raw bytes
    assert a.text == b.text and "".join(pieces) == a.text
    greedy = generate(tmp_path / "run", "apple", temperature=0, max_new_tokens=5)
    assert greedy.token_ids == generate(tmp_path / "run", "apple", temperature=0, max_new_tokens=5, seed=9).token_ids
    with pytest.raises(UserError, match="raw byte tokenizer.*drop --chat"):
        generate(tmp_path / "run", "apple", chat=True)
