"""The default model actually learns: it memorises a tiny batch, and reaches >= 97% on digits."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from trainforge.config import ModelConfig
from trainforge.data.base import DataInfo
from trainforge.models import build_model

DIGITS = DataInfo("classification", "image", (1, 8, 8), "float32", 10)


def test_cnn_overfits_a_tiny_batch():
    x = torch.randn(32, 1, 8, 8)
    y = torch.randint(0, 10, (32,))  # random labels: only memorising gets the loss to zero
    model, _ = build_model(ModelConfig(name="cnn"), DIGITS)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(80):
        loss = F.cross_entropy(model(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert first > 2.0
    assert loss.item() < 0.05


def test_default_cnn_reaches_97_percent_on_digits_in_five_epochs():
    features, labels = load_digits(return_X_y=True)  # bundled with scikit-learn: no download
    x = features.astype(np.float32).reshape(-1, 1, 8, 8)
    x_train, x_test, y_train, y_test = train_test_split(x, labels, test_size=0.2, stratify=labels, random_state=0)
    mean, std = x_train.mean(), x_train.std()
    x_train, x_test = torch.from_numpy((x_train - mean) / std), torch.from_numpy((x_test - mean) / std)
    y_train, y_test = torch.from_numpy(y_train), torch.from_numpy(y_test)

    model, _ = build_model(ModelConfig(name="cnn"), DIGITS)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(5):
        model.train()
        for idx in torch.randperm(len(x_train)).split(64):
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
    assert accuracy >= 0.97
