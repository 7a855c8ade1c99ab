"""Submissions are validated like the CLI validates them and sized by the planner."""
from __future__ import annotations

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
