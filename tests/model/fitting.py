"""The check every new scheme's tests share: a tiny model of it trains a few steps on a fixed batch with
finite gradients and a falling loss."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def trains_with_finite_gradients(model: torch.nn.Module, tokens: torch.Tensor, steps: int = 8, lr: float = 1e-2) -> None:
    """Next-token training on `tokens` (B, T): every gradient finite, the last loss below the first."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
