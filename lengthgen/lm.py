"""Perplexity of a language model on the test split, window by window.

For a window size W the first `tokens` + 1 tokens of the test stream are cut
into consecutive non-overlapping windows: window k reads tokens kW .. kW+W-1
and predicts tokens kW+1 .. kW+W, so every one of the `tokens` scored tokens
is predicted exactly once per window size, with W - 1 tokens of context at
most (the last window may be shorter). The same tokens are scored at every
window size, so perplexities of different windows compare like for like.

Out: mean loss (nats per token), perplexity = exp(mean loss), next-token
accuracy, and the mean loss at each position of the window (position p has
p tokens of context): where a scheme trained on short windows starts to fail.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .methods import Method
from .tasks import IGNORE
from .tasks.text import Text


def split_windows(task: Text, window: int, tokens: int, batch_windows: int, split: str = "test"):
    """Batches of the consecutive windows of size `window` over the first `tokens` scored tokens."""
    stream = task.corpus.tokens(split)
    tokens = min(tokens, len(stream) - 1) if tokens else len(stream) - 1
    stream = stream[:tokens + 1]
    starts = torch.arange(0, tokens, window)
    for first in range(0, len(starts), batch_windows):
        chunk = starts[first:first + batch_windows]
        n = torch.full((len(chunk),), window)
        yield task.windows(stream, chunk, n)


@torch.no_grad()
def perplexity_at(task: Text, method: Method, model, window: int, tokens: int, batch_tokens: int,
                  device: torch.device, split: str = "test") -> tuple[dict, np.ndarray]:
    """({loss, perplexity, accuracy, token_accuracy, tokens}, per-position mean loss (window,))
    on the first `tokens` tokens of `split` (0: all of it)."""
    loss_sum = torch.zeros(window, dtype=torch.float64, device=device)
    count = torch.zeros(window, dtype=torch.float64, device=device)
    right = torch.zeros((), dtype=torch.float64, device=device)
    for batch in split_windows(task, window, tokens, max(1, batch_tokens // window), split):
        batch = batch.to(device)
        logits = method.logits(model, batch)
        scored = batch.targets != IGNORE
        nll = F.cross_entropy(logits.float().transpose(1, 2), batch.targets, ignore_index=IGNORE, reduction="none")
        width = nll.shape[1]
        loss_sum[:width] += (nll * scored).sum(0).double()
        count[:width] += scored.sum(0).double()
        right += ((logits.argmax(-1) == batch.targets) & scored).sum().double()
    total = float(count.sum())
    loss = float(loss_sum.sum()) / total
    accuracy = float(right) / total
    per_position = (loss_sum / count.clamp(min=1)).cpu().numpy()
    per_position[count.cpu().numpy() == 0] = math.nan
    return ({"loss": loss, "perplexity": math.exp(loss), "accuracy": accuracy, "token_accuracy": accuracy,
             "tokens": int(total)}, per_position)
