"""`model.name: hf` under the run's setup: DDP and FSDP on 2 CPU processes (gloo, through the real launcher)
against one process with the same global batch, FSDP's blocks of a transformers model, and bf16 autocast with
gradient accumulation. Tiny models saved locally the way the hub ships them (tests/tiny_models.py); their
dropout is off where runs of different world sizes must match (each rank draws its own dropout masks)."""
from __future__ import annotations

import json

import pytest
import torch
from test_data_parallel_runs import BASE, command, run, train_losses, weights
from tiny_models import corpus, save_tiny_bert, save_tiny_llama, write_labelled_texts

import trainforge
from trainforge.data import build_data
from trainforge.engine.parallelize import find_blocks
from trainforge.models import build_model
from trainforge.engine.metrics import read_metrics


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    (root / "corpus.txt").write_text("\n".join(corpus(200)))
    return {"texts": write_labelled_texts(root / "texts.jsonl", corpus(200)),
            "corpus": root / "corpus.txt",
            "bert": save_tiny_bert(root / "bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
            # tied input and output embeddings (as in Llama 3.2 1B, GPT-2, SmolLM): one parameter, two modules
            "llama": save_tiny_llama(root / "llama", tie_word_embeddings=True)}


TEXT = ["data.tokenizer=model", "data.normalize=none", "data.augment.rotation_deg=0", "data.augment.crop_scale=null",
        "model.name=hf"]


def bert_run(files, *extra: str) -> list[str]:
    return [*TEXT, "data.source=jsonl", f"data.path={files['texts']}", "data.args.seq_len=16",
            f"model.args={{pretrained: {files['bert']}}}", "train.global_batch_size=16", *extra]


def llama_run(files, *extra: str) -> list[str]:
    return [*TEXT, "data.source=textfile", f"data.path={files['corpus']}", "data.args.block_size=32",
            f"model.args={{pretrained: {files['llama']}}}", "train.global_batch_size=8", *extra]


def in_process(run_dir, overrides: list[str], micro: int, resume=None):
    """The one-process reference, in this process (the same config the CLI in `command` would load)."""
    cfg = trainforge.load_config(None, [*BASE, f"train.micro_batch_size={micro}", *overrides])
    return trainforge.train(cfg, run_dir=run_dir, resume=resume)


GPT2 = "{model_type: gpt2, vocab_size: 300, n_layer: 2, n_head: 2, n_embd: 32, n_positions: 64}"  # tied wte / lm_head


@pytest.mark.parametrize("name, layer, layers", [
    ("bert", "BertLayer", lambda m: m.model.bert.encoder.layer),
    ("llama", "LlamaDecoderLayer", lambda m: m.model.model.layers),
    ("gpt2", "GPT2Block", lambda m: m.model.transformer.h),
])
def test_fsdp_shards_exactly_the_transformer_layers_and_tied_embeddings_stay_with_the_root(files, name, layer, layers):
    """Each block becomes its own FSDP group; a parameter a block shared with a module outside it would be sharded
    twice (the tie broken). Tied input/output embeddings lie outside every block: one parameter, in the root's group."""
    overrides = {"bert": bert_run(files), "llama": llama_run(files),
                 "gpt2": llama_run(files, f"model.args={{pretrained: false, config: {GPT2}}}", "data.tokenizer=raw_bytes")}[name]
    cfg = trainforge.load_config(None, overrides)
    model, _ = build_model(cfg.model, build_data(cfg.data, seed=0).info)
    blocks = [block for _, _, block in find_blocks(model)]
    assert [type(b).__name__ for b in blocks] == [layer] * 2 and all(a is b for a, b in zip(blocks, layers(model)))
    inside = {id(p) for b in blocks for p in b.parameters()}
    outside = {id(p) for m in model.modules() if all(m is not n for b in blocks for n in b.modules())
               for p in m.parameters(recurse=False)}
    assert not inside & outside
    if name != "bert":
        assert model.model.get_output_embeddings().weight is model.model.get_input_embeddings().weight


@pytest.mark.serial
@pytest.mark.slow
def test_ddp_of_a_pretrained_bert_classifier_matches_one_process(files, tmp_path):
    """2 processes x micro-batch 4 x accumulation 2 against 1 x 16: the same global batches, the same losses."""
    steps = bert_run(files, "train.max_steps=8")
    in_process(tmp_path / "one", steps, micro=16)
    run(command(tmp_path / "two", *steps, nproc=2, micro=4))
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(two) == 8
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5
    ran = json.loads((tmp_path / "two" / "final" / "model.json").read_text())["ran"]
    assert (ran["strategy"], ran["world_size"], ran["accumulation"]) == ("ddp", 2, 2)


@pytest.mark.serial
@pytest.mark.slow
def test_fsdp_of_a_tied_llama_matches_one_process_and_resumes_on_one(files, tmp_path):
    """2 x 4 under FSDP (each LlamaDecoderLayer sharded, the tied embedding with the root) match 1 x 8; the sharded
    checkpoint resumes on one process and the run ends with the one-process run's weights, still tied."""
    from transformers import AutoModelForCausalLM

    in_process(tmp_path / "ref", llama_run(files, "train.max_steps=6"), micro=8)
    run(command(tmp_path / "fsdp", *llama_run(files, "train.max_steps=4", "distributed.strategy=fsdp"), nproc=2, micro=4))
    assert (tmp_path / "fsdp" / "checkpoints" / "step-000004" / ".metadata").exists()  # shards (DCP)
    in_process(tmp_path / "fsdp", llama_run(files, "train.max_steps=6"), micro=8, resume="auto")
    ref, resumed = train_losses(tmp_path / "ref"), train_losses(tmp_path / "fsdp")
    assert len(ref) == len(resumed) == 6
    assert max(abs(a - b) for a, b in zip(ref, resumed)) < 1e-5
    a, b = weights(tmp_path / "ref"), weights(tmp_path / "fsdp")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "final" / "hf")
    assert final.lm_head.weight is final.model.embed_tokens.weight


def test_bf16_autocast_with_accumulation_trains_a_pretrained_bert(files, tmp_path):
    result = in_process(tmp_path / "run", bert_run(files, "train.max_steps=12", "train.precision=bf16",
                                                   "optim.lr=3e-3"), micro=4)
    ran = json.loads((result.run_dir / "final" / "model.json").read_text())["ran"]
    assert (ran["precision"], ran["micro_batch_size"], ran["accumulation"]) == ("bf16", 4, 4)
    losses = [r["loss"] for r in read_metrics(result.run_dir / "metrics.jsonl") if r["split"] == "train"]
    assert len(losses) == 12 and all(map(torch.isfinite, torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < losses[0]


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("strategy, base", [("ddp", "none"), ("fsdp", "nf4")])
def test_lora_on_two_processes_matches_one_and_keeps_only_adapters(files, tmp_path, strategy, base):
    """LoRA under ddp, and QLoRA under fsdp (FSDP2 over blocks whose frozen base weights are NF4): 2 x 4 matches
    1 x 8, and the checkpoint (whole or sharded) and final/ hold the adapters alone."""
    from safetensors.torch import load_file

    lora = ["model.lora={r: 4, alpha: 8, dropout: 0.0, target_modules: [q_proj, v_proj]}", f"model.quantize_base={base}"]
    if base == "nf4":  # FSDP shards NF4 weights by their blocks of scalers: layers as wide as real ones have enough
        wide = save_tiny_llama(tmp_path / "wide", tie_word_embeddings=True, hidden_size=256, intermediate_size=512)
        lora.append(f"model.args={{pretrained: {wide}}}")
    in_process(tmp_path / "one", llama_run(files, "train.max_steps=4", *lora, "optim.lr=1e-2"), micro=8)
    run(command(tmp_path / "two", *llama_run(files, "train.max_steps=4", *lora, "optim.lr=1e-2",
                                           f"distributed.strategy={strategy}"), nproc=2, micro=4))
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(two) == 4 and max(abs(a - b) for a, b in zip(one, two)) < 1e-5
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert a.keys() == b.keys() and all(".lora_" in k for k in a)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    step = tmp_path / "two" / "checkpoints" / "step-000004"
    if strategy == "ddp":
        assert set(load_file(str(step / "model.safetensors"))) == set(a)
    else:
        from torch.distributed.checkpoint import FileSystemReader

        saved = FileSystemReader(str(step)).read_metadata().state_dict_metadata
        assert {k.removeprefix("model.") for k in saved if k.startswith("model.")} == set(a)
