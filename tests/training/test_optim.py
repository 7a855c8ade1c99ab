"""Optimizers: registry, and no weight decay on biases, norms and embeddings."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from trainforge.config import OptimConfig
from trainforge.errors import UnknownNameError, UserError
from trainforge.engine.optim import OPTIMIZERS, build_optimizer, freeze, layer_ids, param_groups, set_lr


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
    groups = {g["weight_decay"]: g for g in param_groups(m, OptimConfig(weight_decay=0.1))}
    decay, no_decay = groups[0.1], groups[0.0]
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = lambda ps: {id(p) for p in ps}
    assert ids(decay["params"]) == {id(m.lin.weight), id(m.conv.weight)}
    assert ids(no_decay["params"]) == {id(p) for p in m.parameters()} - ids(decay["params"])


def test_tied_parameter_appears_once():
    m = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    m[1].weight = m[0].weight
    groups = param_groups(m, OptimConfig(weight_decay=0.1))
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


class Stack(nn.Module):
    """embeddings -> 3 numbered blocks -> head, as transformer stacks are laid out."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.head = nn.Linear(4, 2)


def lr_of(optimizer, param) -> float:
    return next(g["lr"] for g in optimizer.param_groups if any(q is param for q in g["params"]))


def test_freeze_turns_gradients_off_and_the_optimizer_skips_those_parameters():
    m = Stack()
    frozen, total = freeze(m, ["emb.*", "re:^layers\\.[01]\\."])
    assert frozen == 40 + 2 * 20 and total == sum(p.numel() for p in m.parameters())
    assert not m.emb.weight.requires_grad and not m.layers[1].bias.requires_grad and m.layers[2].weight.requires_grad
    opt = build_optimizer(m, OptimConfig())
    trained = {id(p) for g in opt.param_groups for p in g["params"]}
    assert trained == {id(p) for p in [*m.layers[2].parameters(), *m.head.parameters()]}
    with pytest.raises(UserError, match=r"train.freeze\[0\]: 'encoder.\*' matches no parameter .* emb.weight"):
        freeze(Stack(), ["encoder.*"])
    with pytest.raises(UserError, match="nothing to train"):
        build_optimizer(nn.Linear(2, 2).requires_grad_(False), OptimConfig())


def test_param_groups_set_a_peak_lr_and_decay_that_the_schedule_scales():
    m = Stack()
    cfg = OptimConfig(lr=1e-3, weight_decay=0.1, param_groups=[{"match": "head.*", "lr": 1e-2},
                                                               {"match": "*.bias", "weight_decay": 0.05}])
    opt = build_optimizer(m, cfg)
    set_lr(opt, 5e-4)  # e.g. halfway through warmup: every group follows the same shape
    assert lr_of(opt, m.head.weight) == pytest.approx(5e-3) and lr_of(opt, m.head.bias) == pytest.approx(5e-3)
    assert lr_of(opt, m.layers[0].weight) == pytest.approx(5e-4)
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay[id(m.layers[0].bias)] == 0.05 and decay[id(m.layers[0].weight)] == 0.1 and decay[id(m.emb.weight)] == 0
    with pytest.raises(UserError, match=r"optim.param_groups\[0\].match: 'classifier.\*' matches no parameter"):
        build_optimizer(Stack(), OptimConfig(param_groups=[{"match": "classifier.*", "lr": 1.0}]))


def test_layer_decay_lowers_the_lr_layer_by_layer_towards_the_input():
    m = Stack()
    opt = build_optimizer(m, OptimConfig(lr=1.0, layer_decay=0.5))
    set_lr(opt, 1.0)
    got = [lr_of(opt, p) for p in (m.emb.weight, m.layers[0].weight, m.layers[1].weight, m.layers[2].weight,
                                   m.head.weight)]
    assert got == pytest.approx([0.5 ** 4, 0.5 ** 3, 0.5 ** 2, 0.5, 1.0])
    assert layer_ids(["wte.weight", "h.0.attn.w", "h.1.attn.w", "ln_f.weight"]) == ([0, 1, 2, 3], 2)
