"""Perplexity of a language model on the test split, window by window; and the loss of each
test token with a fixed context, whole or ablated.

For a window size W the first `tokens` + 1 tokens of the test stream are cut
into consecutive non-overlapping windows: window k reads tokens kW .. kW+W-1
and predicts tokens kW+1 .. kW+W, so every one of the `tokens` scored tokens
is predicted exactly once per window size, with W - 1 tokens of context at
most (the last window may be shorter). The same tokens are scored at every
window size, so perplexities of different windows compare like for like.

Out: mean loss (nats per token), perplexity = exp(mean loss), next-token
accuracy, and the mean loss at each position of the window (position p has
p tokens of context): where a scheme trained on short windows starts to fail.

Per token, fixed context (`token_losses`): each scored token t of a test document is
predicted from exactly c preceding tokens of its own document, for every c asked for, by a
pass over those c tokens alone (position IDs 0..c-1), scored at its last column. Documents
no longer than the largest c are dropped, never padded across a document boundary; in the
others every `stride`-th token from position max(c) on is scored. One pass per token and c:
the cost of a token is the sum of the contexts (tokens run through the model), stated in
RUN/token_eval.json.

Ablation at original positions (`ablated_losses`): t read from any chosen subset of its
preceding tokens, each keeping its own position ID (its place in the window of the largest
context), so RoPE, ALiBi and NoPE see the true distances between the tokens kept, and the
tokens dropped are simply absent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lengthgen.methods.base import Method
from lengthgen.tasks import EOS, IGNORE, PAD, Batch
from lengthgen.tasks.text import Text


@dataclass(frozen=True)
class Scorer:
    """A trained model as the per-token evaluation reads it: `method`'s logits of `model` at each
    row's last column, in passes of at most about `batch_tokens` tokens, on `device`."""

    method: Method
    model: torch.nn.Module | None
    batch_tokens: int
    device: torch.device


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


# -- per token, fixed context ---------------------------------------------------------------------

def documents(stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every document of a split's token stream: the tokens between EOS tokens,
    EOS excluded (a stream without a final EOS ends its last document at its end)."""
    eos = np.flatnonzero(np.asarray(stream) == EOS)
    ends = eos if len(eos) and eos[-1] == len(stream) - 1 else np.append(eos, len(stream))
    starts = np.concatenate([[0], ends[:-1] + 1])
    keep = ends > starts  # two EOS in a row: an empty document
    return starts[keep], ends[keep]


def scored_tokens(stream: np.ndarray, longest: int, stride: int = 1, limit: int = 0) -> dict[str, np.ndarray]:
    """The tokens a per-token evaluation scores: in every document longer than `longest`, the
    positions longest, longest + stride, ... (each has `longest` tokens of its own document
    before it); with `limit`, that many of them evenly spaced over the whole list, so every
    document keeps its share. {document, position (in its document), index (in the stream)}."""
    starts, ends = documents(stream)
    doc, pos = [], []
    for d, (start, end) in enumerate(zip(starts, ends)):
        p = np.arange(longest, end - start, stride)
        doc.append(np.full(len(p), d))
        pos.append(p)
    doc = np.concatenate(doc).astype(np.int64) if doc else np.zeros(0, np.int64)
    pos = np.concatenate(pos).astype(np.int64) if pos else np.zeros(0, np.int64)
    if limit and len(doc) > limit:
        pick = np.unique(np.linspace(0, len(doc) - 1, limit).round().astype(np.int64))
        doc, pos = doc[pick], pos[pick]
    return {"document": doc, "position": pos, "index": starts[doc] + pos if len(doc) else pos}


def rows_batch(stream: np.ndarray, columns: np.ndarray, widths: np.ndarray, ids: np.ndarray,
               targets: np.ndarray) -> tuple[Batch, torch.Tensor]:
    """Row b reads stream[columns[b, :widths[b]]] with position IDs ids[b, :widths[b]] and is
    scored on stream[targets[b]] at its last real column; right-padded with PAD (causal: the
    padding never reaches a real column). Returns the batch and each row's last column."""
    B, W = columns.shape
    real = np.arange(W)[None, :] < widths[:, None]
    tokens = np.asarray(stream[np.where(real, columns, 0).ravel()]).reshape(B, W).astype(np.int64)
    inputs = torch.from_numpy(np.where(real, tokens, PAD))
    last = torch.from_numpy(widths.astype(np.int64) - 1)
    target = torch.full((B, W), IGNORE, dtype=torch.long)
    target[torch.arange(B), last] = torch.from_numpy(np.asarray(stream[targets]).astype(np.int64))
    position_ids = torch.from_numpy(np.where(real, ids, 0).astype(np.int64))
    n = torch.from_numpy(widths.astype(np.int64))
    return Batch(inputs=inputs, targets=target, question_len=n, lengths=n, n_steps=n, position_ids=position_ids), last


@torch.no_grad()
def rows_losses(scorer: Scorer, stream: np.ndarray, columns: list[np.ndarray], ids: list[np.ndarray],
                targets: np.ndarray) -> np.ndarray:
    """The loss (nats) of stream[targets[b]] read from the tokens stream[columns[b]] (ascending,
    each before the target) at position IDs ids[b]: one row per target, batched by width."""
    batch_tokens, device = scorer.batch_tokens, scorer.device
    widths = np.array([len(c) for c in columns], dtype=np.int64)
    out = np.zeros(len(columns), dtype=np.float64)
    order = np.argsort(widths, kind="stable")  # rows of similar width share a batch: little padding
    first = 0
    while first < len(order):
        rows = max(1, batch_tokens // int(widths[order[first]]))
        chunk = order[first:first + rows]
        while len(chunk) > 1 and len(chunk) * int(widths[chunk].max()) > 2 * batch_tokens:
            chunk = chunk[:len(chunk) // 2]
        W = int(widths[chunk].max())
        cols, pids = np.zeros((len(chunk), W), np.int64), np.zeros((len(chunk), W), np.int64)
        for r, i in enumerate(chunk):
            cols[r, :widths[i]], pids[r, :widths[i]] = columns[i], ids[i]
        batch, last = rows_batch(stream, cols, widths[chunk], pids, targets[chunk])
        batch = batch.to(device)
        logits = scorer.method.last_logits(scorer.model, batch, last.to(device))  # (rows, V)
        picked = batch.targets[torch.arange(len(chunk), device=device), last.to(device)]
        out[chunk] = F.cross_entropy(logits.float(), picked, reduction="none").double().cpu().numpy()
        first += len(chunk)
    return out


def context_losses(scorer: Scorer, stream: np.ndarray, index: np.ndarray, context: int) -> np.ndarray:
    """The loss of each token stream[index[b]] from exactly `context` tokens before it (IDs 0..c-1)."""
    losses = np.zeros(len(index), dtype=np.float64)
    rows = max(1, scorer.batch_tokens // context)
    offsets = np.arange(-context, 0)
    with torch.no_grad():
        for first in range(0, len(index), rows):
            chunk = index[first:first + rows]
            columns = chunk[:, None] + offsets[None, :]
            ids = np.broadcast_to(np.arange(context), columns.shape)
            batch, last = rows_batch(stream, columns, np.full(len(chunk), context), ids, chunk)
            batch = batch.to(scorer.device)
            logits = scorer.method.last_logits(scorer.model, batch, last.to(scorer.device))
            picked = batch.targets[:, -1]
            losses[first:first + len(chunk)] = F.cross_entropy(logits.float(), picked,
                                                               reduction="none").double().cpu().numpy()
    return losses


def token_losses(task: Text, scorer: Scorer, contexts: list[int], stride: int, limit: int,
                 split: str = "test") -> dict[str, np.ndarray]:
    """{document, position, token, loss_<c> for every c}: the per-token, fixed-context losses of
    the tokens `scored_tokens` picks (every c scores the same tokens)."""
    stream = task.corpus.tokens(split)
    scored = scored_tokens(stream, max(contexts), stride, limit)
    out = {"document": scored["document"], "position": scored["position"],
           "token": np.asarray(stream[scored["index"]]).astype(np.int64)}
    for c in contexts:
        out[f"loss_{c}"] = context_losses(scorer, stream, scored["index"], c)
    return out


def ablated_losses(scorer: Scorer, stream: np.ndarray, index: np.ndarray, far: list[np.ndarray], near: int,
                   full: int) -> np.ndarray:
    """The loss of each token t = stream[index[b]] read from its `near` preceding tokens plus the
    far tokens far[b] (distances back from t, each in near + 1 .. full), every token at its
    original position ID: its place in the window of the `full` tokens before t (ID full - d for
    the token d back). far[b] = every distance gives the full-context loss; none, the near loss."""
    columns, ids = [], []
    near_d = np.arange(near, 0, -1)
    for t, d in zip(index, far):
        d = np.sort(np.asarray(d, dtype=np.int64))[::-1]  # far first: ascending positions
        dist = np.concatenate([d, near_d])
        columns.append(t - dist)
        ids.append(full - dist)
    return rows_losses(scorer, stream, columns, ids, np.asarray(index))
