"""Language modelling: next-token prediction over every position (plain text, and chat SFT, whose targets mask the
prompt with -100); cross-entropy per token, perplexity."""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from trainforge.tasks.base import Evaluation, Task, finite_exp, mean_cross_entropy, register_task


def lm_metrics(mean_loss_nats: float) -> dict:
    """Perplexity = exp(mean token cross-entropy in nats); inf instead of an OverflowError."""
    loss = float(mean_loss_nats)
    if math.isnan(loss):
        return {"perplexity": float("nan")}
    return {"perplexity": finite_exp(loss)}


@register_task
class LanguageModelling(Task):
    name = "lm"
    title = "language modelling"
    description = "next-token prediction on text or chat (SFT): loss per token, perplexity"
    metrics = ("loss", "perplexity")
    default_metric = "loss"
    generates = True
    predict_refusal = "a language model: sample from it with the checkpoint instead"
    ordered_splits = True
    quality = ("perplexity", "ppl", "perplexity")

    def loss(self, output, target, *, label_smoothing=0.0, reduction="mean"):
        import torch.nn.functional as F  # loaded already where a loss is computed

        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1),
                               label_smoothing=label_smoothing, reduction=reduction)

    def class_logits(self, output):
        return output.reshape(-1, output.shape[-1])  # (N * T, vocabulary): a row a position

    def evaluation(self, info: Any) -> Evaluation:
        return PerplexityEvaluation(self)

    def example_target(self, info, batch_size):
        """Next-token ids (B, T); chat inputs are (B, 2, T), token and position ids, and their targets (B, T)."""
        import torch

        return torch.zeros((batch_size, info.input_shape[-1]), dtype=torch.long)

    def tokens_per_sample(self, info: Any) -> int:
        return int(info.seq_len or info.input_shape[-1])

    def output_shape(self, input_shape: tuple[int, ...], num_classes: int) -> tuple[int, ...]:
        return (-1, *input_shape, num_classes)

    def score_logits(self, logits: np.ndarray, labels: np.ndarray) -> dict[str, Optional[float]]:
        loss, _ = mean_cross_entropy(logits, labels)
        return {"accuracy": None, "perplexity": math.exp(min(loss, 50.0)), "loss": loss}


class PerplexityEvaluation(Evaluation):
    def result(self, detailed: bool) -> dict[str, Any]:
        return lm_metrics(self.mean_loss)
