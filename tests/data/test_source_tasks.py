"""The torch-free table of each data source's default task (what `trainforge recipes` shows) against the sources."""
from __future__ import annotations

import pytest

from trainforge.config import load_config
from trainforge.data import build_data
from trainforge.data.source_tasks import SOURCE_TASK, recipe_task
from trainforge.data.sources.common import SOURCES
from trainforge.errors import UserError
from trainforge.tasks import TASKS


def test_every_source_is_in_the_table_with_a_registered_task():
    assert set(SOURCE_TASK) == set(SOURCES.names())
    assert all(task is None or task in TASKS for task in SOURCE_TASK.values())


TEXT = ["data.source=synthetic_text", "data.args.num_samples=16", "data.args.seq_len=8"]


@pytest.mark.parametrize("overrides", [TEXT, [*TEXT, "task=lm"], [*TEXT, "data.args.task=lm"], [],
                                       ["data.source=synthetic_images", "data.args.num_samples=16",
                                        "data.args.image_size=8"]])
def test_the_table_says_what_a_source_builds(overrides):
    cfg = load_config("digits_cnn", overrides)
    built = build_data(cfg.data, seed=0, fit_stats=False).info.task
    assert built == recipe_task(cfg.model_dump(mode="json"))


def test_a_recipe_that_names_a_task_its_source_does_not_make_is_one_line():
    with pytest.raises(UserError, match=r"^task: lm: data.source digits gives classification data"):
        build_data(load_config("digits_cnn", ["task=lm"]).data, seed=0, fit_stats=False)
    with pytest.raises(UserError, match=r"^task: unknown task 'no_such_task'; choose one of: classification, "):
        build_data(load_config("digits_cnn", ["task=no_such_task"]).data, seed=0, fit_stats=False)
