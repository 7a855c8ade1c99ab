"""Submissions are validated like the CLI validates them and sized by the planner."""
from __future__ import annotations

import time

import pytest
import yaml

from trainforge.errors import UserError
from trainforge.jobs.admission import admit, load_submission
from trainforge.jobs.slots import Slot

MiB = 2**20


def cpu_slots(n: int = 2, memory_bytes: int = 2**30) -> list[Slot]:
    return [Slot(f"cpu{i}", "cpu", "cpu", memory_bytes, memory_bytes) for i in range(n)]


@pytest.mark.parametrize("overrides, message", [
    (["train.max_steps=fast"], "train.max_steps: expected an integer, got 'fast'"),
    (["train.bogus=1"], "train.bogus: unknown key"),
    (["model.name=nosuchnet"], "nosuchnet"),
    (["optim.lr"], "overrides are KEY=VALUE"),
    (["--run-dir=/etc"], "--run-dir: unknown key"),
    (["train.max_steps=5; rm -rf /"], "train.max_steps: expected an integer"),
    (["model.name=custom", "model.target=os:system"], "custom code"),
    (["data.source=custom", "data.target=os:system"], "custom code"),
    (["stage.pruned=true"], "stage.pruned: set by trainforge's own stages"),  # issue 39: internal, never submitted
    (["model.args.trust_remote_code=true"], "--allow-remote-code"),  # issue 40: the operator's to allow
])
def test_bad_submissions_are_one_line_user_errors(overrides, message):
    with pytest.raises(UserError) as e:
        load_submission("digits_cnn", None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_only_built_in_names_or_yaml_text():
    with pytest.raises(UserError, match="not a built-in recipe"):
        load_submission("/etc/passwd", None, [])
    with pytest.raises(UserError, match="malformed YAML"):
        load_submission("mine.yaml", "a: [1,", [])
    with pytest.raises(UserError, match="YAML mapping"):
        load_submission("mine.yaml", "- 1\n- 2\n", [])
    with pytest.raises(UserError, match="stage.mlflow_parent_run_id: set by trainforge's own stages"):
        load_submission("mine.yaml", "stage:\n  mlflow_parent_run_id: abc\n", [])
    cfg = load_submission("mine.yaml", "name: mine\ntrain:\n  max_steps: 7\n", ["optim.lr=0.01"])
    assert (cfg.name, cfg.train.max_steps, cfg.optim.lr) == ("mine", 7, 0.01)


def test_admit_freezes_the_config_and_sizes_the_job():
    job = admit(recipe="digits_cnn", recipe_yaml=None, overrides=["train.max_steps=30", "name=a;b $(x)"],
                num_gpus=1, slots=cpu_slots())
    cfg = yaml.safe_load(job.config_yaml)
    assert cfg["name"] == "a;b $(x)" and cfg["train"]["max_steps"] == 30  # a value, nothing else
    assert job.total_steps == 30 and job.micro_batch_size == 64
    assert 100_000 < job.memory_bytes < 200 * MiB  # the planner's peak for a tiny CNN step


def test_auto_micro_batch_is_pinned_to_what_fits():
    job = admit(recipe="digits_cnn", recipe_yaml=None, overrides=["train.micro_batch_size=auto"], num_gpus=1,
                slots=cpu_slots())
    assert yaml.safe_load(job.config_yaml)["train"]["micro_batch_size"] == job.micro_batch_size == 64
    small = admit(recipe="digits_cnn", recipe_yaml=None, overrides=["train.micro_batch_size=auto"], num_gpus=1,
                  slots=cpu_slots(memory_bytes=job.memory_bytes - 1))
    assert small.micro_batch_size < 64 and small.memory_bytes < job.memory_bytes


def test_a_job_that_can_never_fit_is_rejected():
    with pytest.raises(UserError, match="needs .* MiB .* largest slot holds 1.0 MiB"):
        admit(recipe="digits_cnn", recipe_yaml=None, overrides=[], num_gpus=1, slots=cpu_slots(memory_bytes=MiB))
    with pytest.raises(UserError, match="asks for 3 GPUs"):
        admit(recipe="digits_cnn", recipe_yaml=None, overrides=[], num_gpus=3, slots=cpu_slots(2))
    with pytest.raises(UserError, match="larger than the training split"):  # even with max_steps: the job resolves it
        admit(recipe="digits_cnn", recipe_yaml=None, overrides=["train.global_batch_size=4096", "train.max_steps=5"],
              num_gpus=1, slots=cpu_slots())
    with pytest.raises(UserError, match="does not divide over 2 GPUs"):
        admit(recipe="digits_cnn", recipe_yaml=None, overrides=["train.global_batch_size=63", "train.micro_batch_size=1"],
              num_gpus=2, slots=cpu_slots(2))


# ---------------------------------------------------------------- the weights floor: refusing before simulating

TINY_LLAMA = ("model.args={pretrained: false, config: {model_type: llama, vocab_size: 256, hidden_size: 64, "
              "intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
              "max_position_embeddings: 128}}")
LLAMA = ["data.source=synthetic_text", "data.args={task: lm, num_samples: 64, seq_len: 64, vocab_size: 256}",
         "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none", "model.name=hf",
         TINY_LLAMA, "train.global_batch_size=8", "train.micro_batch_size=8", "train.precision=bf16",
         "train.early_stopping=null"]
LORA = "model.lora={r: 8, alpha: 16, dropout: 0.0, target_modules: all-linear}"


@pytest.mark.parametrize("recipe, overrides, num_gpus", [
    pytest.param("digits_cnn", [], 1, id="cnn"),
    pytest.param("charlm_gpt", ["model.args.n_layer=2", "data.args.max_bytes=20000", "train.precision=bf16"], 1,
                 id="gpt-tied-bf16"),
    pytest.param("charlm_gpt", ["model.args.n_layer=2", "data.args.max_bytes=20000", "train.freeze=[transformer.h.0.*, transformer.wpe.*]"], 1,
                 id="gpt-frozen-block"),
    pytest.param("charlm_gpt", ["model.args.n_layer=2", "data.args.max_bytes=20000", "distributed.strategy=fsdp"], 2,
                 id="gpt-fsdp2"),
    pytest.param("digits_cnn", LLAMA + [LORA], 1, id="lora"),
    pytest.param("digits_cnn", LLAMA + [LORA, "model.quantize_base=nf4"], 1, id="qlora"),
])
def test_the_weights_floor_never_exceeds_the_simulated_peak(recipe, overrides, num_gpus):
    """The floor refuses only what the simulation would refuse: it is at most the smallest simulated peak (micro-batch
    1) of the setup the job resolves, frozen weights, tied ones, FSDP shards and an NF4 base included."""
    import torch

    from trainforge.data import build_data
    from trainforge.engine.env import DistEnv, resolve_strategy
    from trainforge.models import build_model
    from trainforge.planning.memory import sim_key
    from trainforge.planning.plan import Planner, quantize_kind, weights_floor_bytes
    from trainforge.engine.optim import freeze
    from trainforge.engine.precision import resolve_precision

    cfg = load_submission(recipe, None, ["train.max_steps=10", *overrides])
    info = build_data(cfg.data, seed=cfg.seed, fit_stats=False).info
    with torch.device("meta"):
        model = build_model(cfg.model, info)[0]
    if cfg.train.freeze:
        freeze(model, cfg.train.freeze)
    floor = weights_floor_bytes(model, shards=num_gpus, frozen_stored=quantize_kind(cfg) == "none")
    strategy = resolve_strategy(cfg.distributed.strategy, DistEnv(world_size=num_gpus))[0]
    precision = resolve_precision(cfg.train.precision, "cpu", True)[0]
    sim = Planner(cfg, info=info, steps=10).cache.get(sim_key(strategy, num_gpus, False, precision), 1)
    assert 0 < floor <= sim.peak_bytes, (floor, sim.peak_bytes, sim.breakdown)


@pytest.mark.serial  # a timing bar: measured with the machine to itself
def test_a_model_too_big_for_its_weights_is_refused_without_simulating(monkeypatch):
    from trainforge.planning import plan as plan_module

    mlp = ["model.name=mlp", "model.args={hidden: [8192, 8192]}", "data.augment.rotation_deg=0",
           "data.augment.crop_scale=null"]  # ~270 MB of fp32 weights
    small = cpu_slots(memory_bytes=128 * MiB)
    monkeypatch.setattr("trainforge.jobs.admission.weights_floor_bytes", lambda *a, **k: 0.0)  # no floor:
    with pytest.raises(UserError, match="planner's predicted peak"):  # the simulation refuses it...
        admit(recipe="digits_cnn", recipe_yaml=None, overrides=mlp, num_gpus=1, slots=small)
    monkeypatch.undo()

    def no_simulation(*args, **kwargs):
        raise AssertionError("simulated a model whose weights alone cannot fit")

    monkeypatch.setattr(plan_module, "simulate_step", no_simulation)
    with pytest.raises(UserError, match="needs 258.4 MiB for its weights alone but the largest slot holds 128.0 MiB"):
        admit(recipe="digits_cnn", recipe_yaml=None, overrides=mlp, num_gpus=1, slots=small)  # ...and so does the floor
    # 96 blocks of width 1024: 4.5 GiB of weights; its simulation alone took 12.6 s here (18 s with auto), the floor
    # answers in well under a second
    deep = ["model.args.n_layer=96", "model.args.n_embd=1024", "data.args.max_bytes=20000"]
    for extra in ([], ["train.micro_batch_size=auto"]):
        t0 = time.monotonic()
        with pytest.raises(UserError, match="for its weights alone") as e:
            admit(recipe="charlm_gpt", recipe_yaml=None, overrides=[*deep, *extra], num_gpus=1, slots=cpu_slots())
        assert time.monotonic() - t0 < 3.0 and "\n" not in str(e.value)
