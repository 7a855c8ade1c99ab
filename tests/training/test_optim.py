"""Optimizers: registry, and no weight decay on biases, norms and embeddings."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from trainforge.config import OptimConfig
from trainforge.errors import UnknownNameError
from trainforge.training.optim import OPTIMIZERS, build_optimizer, param_groups


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.pos_emb = nn.Parameter(torch.zeros(1, 3, 4))
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)


def test_decay_only_on_weight_matrices():
    m = Toy()
    decay, no_decay = param_groups(m, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = lambda ps: {id(p) for p in ps}
    assert ids(decay["params"]) == {id(m.lin.weight), id(m.conv.weight)}
    assert ids(no_decay["params"]) == {id(p) for p in m.parameters()} - ids(decay["params"])


def test_tied_parameter_appears_once():
    m = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    m[1].weight = m[0].weight
    groups = param_groups(m, 0.1)
    assert sum(len(g["params"]) for g in groups) == 1


@pytest.mark.parametrize("name", OPTIMIZERS.names())
def test_each_optimizer_steps(name):
    m = nn.Linear(3, 1)
    opt = build_optimizer(m, OptimConfig(name=name, lr=0.1, weight_decay=0.01))
    before = m.weight.detach().clone()
    m(torch.ones(2, 3)).sum().backward()
    opt.step()
    assert not torch.equal(before, m.weight)


def test_unknown_optimizer_lists_names():
    with pytest.raises(UnknownNameError, match="optim.name: unknown optimizer 'lamb'; choose one of: adamw, sgd"):
        build_optimizer(nn.Linear(2, 2), OptimConfig(name="lamb"))
