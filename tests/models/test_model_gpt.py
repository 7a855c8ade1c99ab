"""The nanoGPT-style `gpt`: GPT-2 shapes and parameter count, causality, weight tying, init, limits."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.errors import UserError
from trainforge.models import build_model

GPT2_DATA = DataInfo("lm", "text", (1024,), "int64", 50257, vocab_size=50257, seq_len=1024)
SMALL = DataInfo("lm", "text", (16,), "int64", 64, vocab_size=64, seq_len=16)
GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768}


def gpt(info: DataInfo = SMALL, **args):
    return build_model(ModelConfig(name="gpt", args=args), info)[0]


def test_gpt2_small_has_124m_parameters():
    with torch.device("meta"):  # 124M parameters cost no memory on the meta device
        model = gpt(GPT2_DATA, **GPT2_SMALL)
    assert model.num_params(non_embedding=False) == 124_439_808
    # nanoGPT reports 123.65M (without positions); without token embeddings as well, the blocks + ln_f
    assert model.num_params() == 124_439_808 - 50257 * 768 - 1024 * 768 == 85_056_000
    assert model.transformer.wpe.weight.shape == (1024, 768)


def test_untied_head_is_its_own_parameter():
    with torch.device("meta"):
        model = gpt(GPT2_DATA, **GPT2_SMALL, tie_weights=False)
    assert model.num_params(non_embedding=False) == 124_439_808 + 50257 * 768


def test_tied_weights_share_storage():
    tied = gpt()
    assert tied.lm_head.weight.data_ptr() == tied.transformer.wte.weight.data_ptr()
    untied = gpt(tie_weights=False)
    assert untied.lm_head.weight.data_ptr() != untied.transformer.wte.weight.data_ptr()


def test_logits_are_causal():
    model = gpt(n_layer=2, n_embd=32, n_head=2).eval()
    x = torch.randint(1, 64, (2, 16))
    t = 9
    changed = x.clone()
    changed[:, t] = (x[:, t] + 7) % 64
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert a.shape == (2, 16, 64)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, t:], b[:, t:])  # the change does reach position t and later


def test_nanogpt_init():
    model = gpt(n_layer=8, n_embd=256, n_head=4)
    block = model.transformer.h[0]
    assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert block.attn.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert not block.attn.c_attn.bias.detach().any()


def test_no_bias_option_drops_every_bias():
    model = gpt(bias=False)
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())


def test_shorter_sequences_are_fine_longer_ones_are_a_clear_error():
    model = gpt(n_layer=1, n_embd=32, n_head=2)
    assert model(torch.randint(0, 64, (1, 5))).shape == (1, 5, 64)
    with pytest.raises(UserError, match=r"model\.args\.block_size: got sequences of 17 tokens but block_size is 16"):
        model(torch.randint(0, 64, (1, 17)))


def test_padded_vocab_is_allowed_smaller_is_not():
    assert gpt(vocab_size=128).lm_head.out_features == 128
    with pytest.raises(UserError, match=r"model\.args\.vocab_size: 32 is below the data's vocabulary of 64"):
        gpt(vocab_size=32)
    with pytest.raises(UserError, match=r"model\.args\.block_size: 8 is shorter than the data's 16-token"):
        gpt(block_size=8)


def test_gpt_overfits_a_repeating_sequence():
    model = gpt(n_layer=2, n_embd=64, n_head=4)
    x = torch.arange(16).repeat(4, 2)[:, :17] % 64  # tokens 0..15, then 0: next token is fully determined
    inputs, targets = x[:, :16], x[:, 1:17]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(60):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
