"""Methods: named recipes over a model, a loss and a prediction rule.

A method builds its model, computes the training loss of a Batch and predicts
the answer tokens at the scored positions. Every method is compared on the
same metric: exact match of the whole answer (answer tokens and the EOS).

`ntp` is plain next-token prediction with a decoder. Its exact match is
computed from one teacher-forced pass: if the argmax at every scored
position is right, greedy decoding reproduces the answer token by token (each
step sees only correct earlier tokens), and if any is wrong greedy decoding
goes wrong at the first such position. So the two exact-match scores are
identical, and one pass costs a fraction of T decoding passes.
`token_accuracy` is the teacher-forced per-token accuracy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import Config
from .model import Transformer
from .tasks import IGNORE, Batch, Task


class Method:
    name = ""

    def build_model(self, cfg: Config, task: Task) -> nn.Module:
        return Transformer(cfg.model, task.vocab_size)

    def logits(self, model: nn.Module, batch: Batch) -> Tensor:  # (B, L, V)
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        logits = self.logits(model, batch)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)

    @torch.no_grad()
    def predict(self, model: nn.Module, batch: Batch) -> Tensor:
        """(B, L) predicted token at every position; only scored ones count."""
        return self.logits(model, batch).argmax(-1)


class NextTokenPrediction(Method):
    name = "ntp"

    def logits(self, model, batch):
        return model(batch.inputs, batch.position_ids)


METHODS: dict[str, type[Method]] = {"ntp": NextTokenPrediction}


def get_method(name: str) -> Method:
    return METHODS[name]()


def score(pred: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
    """Per-sample (exact match, token accuracy) over the scored positions."""
    scored = batch.scored
    right = (pred == batch.targets) & scored
    exact = (right | ~scored).all(1)
    token = right.sum(1).float() / scored.sum(1).clamp(min=1)
    return exact, token
