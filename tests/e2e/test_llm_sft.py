"""LoRA supervised fine-tuning on chat data, end to end on a tiny local Llama: the shipped recipe runs offline,
packed and unpacked windows give the same loss on the same conversations, and a LoRA SFT learns a crafted
question -> answer mapping that the base model does not know."""
from __future__ import annotations

import json

import pytest
import torch
from tiny_models import save_tiny_llama

import trainforge
from trainforge.data import build_data
from trainforge.models import build_model
from trainforge.training.generate import generate
from trainforge.engine.losses import task_loss

# the tokenizer's own template: a role line, the content, end-of-text closing each turn
TEMPLATE = ("{% for m in messages %}{{ m['role'] + '\n' + m['content'] }}{{ eos_token }}{% endfor %}"
            "{% if add_generation_prompt %}{{ 'assistant\n' }}{% endif %}")
QUESTIONS = ["alpha beta", "gamma delta", "epsilon zeta", "eta theta", "iota kappa", "lambda sigma", "omega the",
             "a of", "and is", "was on"]
ANSWERS = ["red apple", "green grape", "blue mango", "yellow lemon", "black cherry", "white banana", "red lemon",
           "green mango", "blue apple", "black grape"]
QUIET = ["log.progress=false", "log.tensorboard=false", "train.early_stopping=null", "schedule.warmup_steps=0"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    chats = root / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                      {"role": "assistant", "content": a}]}) + "\n"
                             for q, a in zip(QUESTIONS, ANSWERS)))
    # a random base whose frozen output head can express confident answers (at the default 0.02 scale its logits
    # stay within about +-0.6 whatever the adapters do: no mapping is learnable through them)
    return {"chats": chats, "llama": save_tiny_llama(root / "llama", chat_template=TEMPLATE, initializer_range=0.3)}


def sft(files, *extra: str) -> list[str]:
    return [f"data.path={files['chats']}", f"model.args.pretrained={files['llama']}", "data.args.seq_len=32",
            "data.val_fraction=0.1", "data.test_fraction=0.1", *QUIET, *extra]


def answers(run_dir, questions) -> list[str]:
    return [generate(run_dir, q, chat=True, temperature=0, max_new_tokens=6).text.strip() for q in questions]


def trained_on(cfg) -> list[int]:
    """The conversations of the train split (the others are held out): those whose question its windows hold."""
    from transformers import AutoTokenizer

    bundle, tok = build_data(cfg.data, seed=cfg.seed), AutoTokenizer.from_pretrained(cfg.model.args["pretrained"])
    text = " ".join(tok.decode(bundle.train[i][0][0]) for i in range(len(bundle.train)))
    return [i for i, q in enumerate(QUESTIONS) if f"user\n{q}" in text]


def test_the_recipe_learns_a_crafted_mapping_the_base_does_not_know(files, tmp_path):
    """llm_lora_sft as shipped (hub id and all), with only the data, the model and the sizes overridden."""
    cfg = trainforge.load_config("llm_lora_sft", sft(files, "train.max_steps=60", "train.global_batch_size=6",
                                                     "train.micro_batch_size=6", "optim.lr=2e-2",
                                                     "model.lora.dropout=0.0", "train.eval_every_steps=60",
                                                     "train.checkpoint_every_steps=60"))
    untrained = trainforge.train(cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_steps": 1}),
                                                        "optim": cfg.optim.model_copy(update={"lr": 1e-9})}),
                                 run_dir=tmp_path / "base")
    train = trained_on(cfg)
    questions, expected = [QUESTIONS[i] for i in train], [ANSWERS[i] for i in train]
    before = answers(untrained.run_dir, questions)
    result = trainforge.train(cfg, run_dir=tmp_path / "sft")
    after = answers(result.run_dir, questions)
    assert len(train) >= 6 and sum(a == b for a, b in zip(before, expected)) == 0
    assert sum(a == b for a, b in zip(after, expected)) >= len(train) - 1, (after, expected)
    ran = json.loads((result.run_dir / "final" / "model.json").read_text())
    assert ran["base"]["source"] == str(files["llama"]) and (result.run_dir / "final" / "adapter").is_dir()


def test_packed_and_unpacked_windows_give_the_same_loss_on_the_same_conversations(files):
    """The same model, the same conversations: the mean loss over every assistant token is the same whether each
    conversation has a window of its own or several share one (positions restart, attention stays inside)."""
    losses, windows = {}, {}
    for pack in (False, True):
        cfg = trainforge.load_config("llm_lora_sft", sft(files, f"data.args.pack={str(pack).lower()}",
                                                         "data.args.seq_len=64"))
        bundle = build_data(cfg.data, seed=0)
        torch.manual_seed(0)
        model, _ = build_model(cfg.model, bundle.info)
        x = torch.stack([bundle.train[i][0] for i in range(len(bundle.train))])
        y = torch.stack([bundle.train[i][1] for i in range(len(bundle.train))])
        with torch.no_grad():
            losses[pack] = float(task_loss(model.eval()(x), y, "lm"))
        windows[pack] = len(x)
    assert windows[True] < windows[False]  # packing did pack
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)


def test_each_evaluation_writes_greedy_answers_to_fixed_validation_prompts(files, tmp_path):
    """samples.jsonl holds, per evaluation, the same validation prompts with the model's greedy answer and the
    reference; the report shows them; the answers are what `trainforge generate` says for that prompt."""
    cfg = trainforge.load_config("llm_lora_sft", sft(files, "train.max_steps=4", "train.eval_every_steps=2",
                                                     "train.global_batch_size=2", "train.micro_batch_size=2",
                                                     "data.val_fraction=0.3"))
    run_dir = trainforge.train(cfg, run_dir=tmp_path / "run").run_dir
    rows = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    steps = sorted({r["step"] for r in rows})
    assert steps == [2, 4] and len(rows) == 2 * len([r for r in rows if r["step"] == 2]) >= 4
    first = [r for r in rows if r["step"] == 2]
    assert [r["prompt"] for r in first] == [r["prompt"] for r in rows if r["step"] == 4]
    for r in first:  # a prompt is a rendered question, the reference its crafted answer
        question = r["prompt"].split("user\n")[1].split("</s>")[0]
        assert question in QUESTIONS and r["reference"].strip() == ANSWERS[QUESTIONS.index(question)]
    last = [r for r in rows if r["step"] == 4]
    assert [generate(run_dir, r["prompt"].split("user\n")[1].split("</s>")[0], chat=True, temperature=0,
                     max_new_tokens=48).text for r in last] == [r["answer"] for r in last]
    assert "Generated answers" in (run_dir / "report.html").read_text()


def test_final_hf_serves_chat_alone_with_the_template_it_trained_with(files, tmp_path, capsys):
    """A run on a built-in template (chatml) its tokenizer lacks: final/hf carries that template, transformers
    renders with it, and `trainforge predict` / `generate` serve final/hf with greedy answers equal to the run's."""
    from transformers import AutoTokenizer

    from trainforge.cli import main

    cfg = trainforge.load_config("llm_lora_sft", sft(files, "train.max_steps=2", "data.args.template=chatml", "data.args.seq_len=128",
                                                     "train.global_batch_size=2", "train.micro_batch_size=2"))
    run_dir = trainforge.train(cfg, run_dir=tmp_path / "run").run_dir
    hf = run_dir / "final" / "hf"
    rendered = AutoTokenizer.from_pretrained(hf).apply_chat_template([{"role": "user", "content": "alpha beta"}],
                                                                      tokenize=False, add_generation_prompt=True)
    assert rendered == "<|im_start|>user\nalpha beta<|im_end|>\n<|im_start|>assistant\n"
    expected = [generate(run_dir, q, chat=True, temperature=0, max_new_tokens=8).text for q in QUESTIONS[:2]]
    assert [generate(hf, q, chat=True, temperature=0, max_new_tokens=8).text for q in QUESTIONS[:2]] == expected
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(QUESTIONS[:2]) + "\n")
    with pytest.raises(SystemExit) as code:
        main(["predict", str(hf), str(prompts), "--json"])
    assert code.value.code in (0, None)
    doc = json.loads(capsys.readouterr().out)
    assert [p["input"] for p in doc["predictions"]] == QUESTIONS[:2]
    served = [generate(hf, q, chat=True, temperature=0, max_new_tokens=256).text for q in QUESTIONS[:2]]
    assert [p["text"] for p in doc["predictions"]] == served and doc["variant"] == "hf" and doc["chat"]
