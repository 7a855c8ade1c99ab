"""`model.lora`: LoRA adapters (PEFT) on a tiny local Llama: only adapters train, the base stays bit-identical and
is referenced by its SHA-256; checkpoints and final/ hold the adapters alone; final/adapter loads with PEFT,
final/hf is the merged model, and both give trainforge's logits; a resumed run is bit-identical."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import corpus, save_tiny_llama

import trainforge
from trainforge.errors import UserError
from trainforge.training.artifacts import load_trained

LORA = "model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj]}"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    (root / "corpus.txt").write_text("\n".join(corpus(200)))
    return {"corpus": root / "corpus.txt", "llama": save_tiny_llama(root / "llama")}


def overrides(files, *extra: str) -> list[str]:
    return ["data.source=textfile", f"data.path={files['corpus']}", "data.args.block_size=32", "data.tokenizer=model",
            "model.name=hf", f"model.args={{pretrained: {files['llama']}}}", LORA, "optim.lr=1e-2",
            "train.global_batch_size=8", "train.micro_batch_size=4", "train.eval_every_steps=3",
            "train.checkpoint_every_steps=3", "train.log_every_steps=1", "train.early_stopping=null", "schedule.warmup_steps=0",
            "log.progress=false", "log.tensorboard=false", "log.report=false", *extra]


def train(files, run_dir: Path, *extra: str, resume=None):
    return trainforge.train(trainforge.load_config(None, overrides(files, *extra)), run_dir=run_dir, resume=resume)


@pytest.fixture(scope="module")
def lora_run(files, tmp_path_factory):
    return train(files, tmp_path_factory.mktemp("run") / "run", "train.max_steps=6").run_dir


def base_of(files):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(files["llama"]).eval()


def test_only_the_adapters_train_and_the_base_stays_bit_identical(files, lora_run):
    model = load_trained(lora_run).build_model()
    base = base_of(files).state_dict()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    own = model.state_dict()
    for name, tensor in base.items():  # the base's own names sit under base_model.model (and .base_layer)
        mine = next(v for k, v in own.items() if k.endswith(name.replace(".weight", ".base_layer.weight"))
                    or k == f"model.base_model.model.{name}")
        assert torch.equal(mine, tensor), name
    trained_b = [v for k, v in own.items() if ".lora_B." in k]
    assert trained_b and all(v.abs().sum() > 0 for v in trained_b)  # LoRA B starts at zero: these moved


def test_checkpoints_and_final_hold_the_adapters_and_name_their_base(files, lora_run):
    final = load_file(str(lora_run / "final" / "model.safetensors"))
    checkpoint = load_file(str(lora_run / "checkpoints" / "step-000006" / "model.safetensors"))
    for saved in (final, checkpoint):
        assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)
        assert sum(v.numel() for v in saved.values()) < 0.1 * sum(v.numel() for v in base_of(files).parameters())
    base = json.loads((lora_run / "final" / "model.json").read_text())["base"]
    assert base["source"] == str(files["llama"]) and len(base["sha256"]) == 64


def test_final_hf_is_the_merged_model_and_final_adapter_loads_with_peft(files, lora_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = load_trained(lora_run).build_model().eval()
    x = torch.randint(0, 300, (2, 16))
    with torch.no_grad():
        expected = model(x)
        merged = AutoModelForCausalLM.from_pretrained(lora_run / "final" / "hf").eval()(x).logits
        adapted = PeftModel.from_pretrained(base_of(files), lora_run / "final" / "adapter").eval()(x).logits
        plain = base_of(files)(x).logits
    assert (merged - expected).abs().max() < 1e-5
    assert (adapted - expected).abs().max() < 1e-5
    assert (plain - expected).abs().max() > 1e-3  # the adapters change the model: the comparison is not vacuous


def test_a_resumed_lora_run_is_bit_identical(files, lora_run, tmp_path):
    """The run as it was after its step-3 checkpoint (a crash then), resumed to the end: the same losses and
    adapters as the run that never stopped."""
    import shutil

    run_dir = tmp_path / "resumed"
    shutil.copytree(lora_run, run_dir, ignore=shutil.ignore_patterns("final", "step-000006"))
    (run_dir / "checkpoints" / "latest").write_text("step-000003")
    train(files, run_dir, "train.max_steps=6", resume="auto")
    rows = lambda d: [(r["step"], r["loss"]) for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())  # noqa: E731
                      if r["split"] == "train"]
    assert [s for s, _ in rows(run_dir)] == list(range(1, 7)) and rows(run_dir) == rows(lora_run)
    a, b = load_file(str(lora_run / "final" / "model.safetensors")), load_file(str(run_dir / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_adapters_continue_only_on_their_base(files, tmp_path):
    """The folder the run names now holds other weights (the same architecture): resuming is one line, not a run
    of adapters on a base they were not trained on."""
    import shutil

    moved = dict(files, llama=tmp_path / "llama")
    shutil.copytree(files["llama"], moved["llama"])
    train(moved, tmp_path / "run", "train.max_steps=3")
    save_tiny_llama(moved["llama"], seed=2)
    with pytest.raises(UserError, match="trained on base weights .* now gives"):
        train(moved, tmp_path / "run", "train.max_steps=6", resume="auto")
    with pytest.raises(UserError, match=r"model.lora.target_modules: \['qq_proj'\] names no Linear layer.*q_proj"):
        train(files, tmp_path / "bad", "model.lora.target_modules=[qq_proj]", "train.max_steps=1")


def test_the_planner_simulates_a_frozen_base_with_adapters(files):
    """Planned on fake tensors: adapters get AdamW state, the frozen base none; the full fine-tune's optimizer
    state is its parameters' twice over (fp32 AdamW), the LoRA run's the adapters' twice over."""
    from trainforge.data import build_data
    from trainforge.models import build_model
    from trainforge.planning.plan import plan

    plans = {lora: plan(trainforge.load_config(None, overrides(files) if lora else
                                               [o for o in overrides(files) if o != LORA]), gpus=["l4"])
             for lora in (True, False)}
    full, adapted = plans[False].simulation.breakdown, plans[True].simulation.breakdown
    cfg = trainforge.load_config(None, overrides(files))
    real, _ = build_model(cfg.model, build_data(cfg.data, seed=0).info)
    adapters = sum(p.numel() * 4 for p in real.parameters() if p.requires_grad)
    total = sum(p.numel() * 4 for p in real.parameters() if not p.requires_grad)
    assert adapted["optimizer_state"] == pytest.approx(2 * adapters, rel=0.05)
    assert full["optimizer_state"] == pytest.approx(2 * total, rel=0.05)


def test_ema_averages_the_adapters_alone(files, tmp_path):
    """train.ema_decay with LoRA: the shadow holds the trainable weights only, and the run finishes with them."""
    result = train(files, tmp_path / "ema", "train.max_steps=3", "train.ema_decay=0.9")
    saved = load_file(str(result.run_dir / "final" / "model.safetensors"))
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)
    model = load_trained(result.run_dir).build_model()
    from trainforge.engine.ema import EMA

    assert set(EMA(model, 0.9).shadow) == set(saved)
