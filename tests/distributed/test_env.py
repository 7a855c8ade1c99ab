"""Ranks from the environment (torchrun or srun), and the strategy a run resolves to."""
from __future__ import annotations

import pytest

from trainforge.engine.env import DistEnv, detect, resolve_strategy
from trainforge.errors import UserError

VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "MASTER_ADDR",
        "TORCHELASTIC_RUN_ID")


@pytest.fixture
def clean_env(monkeypatch):
    for v in VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_single_process_by_default(clean_env):
    assert detect() == (0, 0, 1)


def test_torchrun_variables(clean_env):
    clean_env.setenv("RANK", "5")
    clean_env.setenv("LOCAL_RANK", "1")
    clean_env.setenv("WORLD_SIZE", "8")
    assert detect() == (5, 1, 8)


def test_srun_variables_need_a_master_address(clean_env):
    clean_env.setenv("SLURM_PROCID", "3")
    clean_env.setenv("SLURM_LOCALID", "3")
    clean_env.setenv("SLURM_NTASKS", "4")
    assert detect() == (0, 0, 1)  # a plain `srun` of one task per node without a rendezvous: single process
    clean_env.setenv("MASTER_ADDR", "node0")
    assert detect() == (3, 3, 4)


def test_strategy_resolution():
    one, many = DistEnv(), DistEnv(rank=0, local_rank=0, world_size=4, backend="gloo")
    assert resolve_strategy("auto", one)[0] == "none" and resolve_strategy("auto", many)[0] == "ddp"
    assert resolve_strategy("fsdp", many) == ("fsdp", None) and resolve_strategy("fsdp", one)[0] == "none"
    with pytest.raises(UserError, match="distributed.strategy: none cannot run on 4 processes"):
        resolve_strategy("none", many)


def test_a_torchrun_worker_is_a_launched_worker_even_alone(clean_env):
    from trainforge.engine.env import launched_worker

    assert not launched_worker()
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "1")
    assert not launched_worker()  # a plain process that set the variables itself
    clean_env.setenv("TORCHELASTIC_RUN_ID", "r")
    assert launched_worker()  # torchrun's group of one (elastic, one node): the launcher owns the run dir
