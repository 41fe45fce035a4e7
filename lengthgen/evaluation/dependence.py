"""Dependence sparsity of the tokens a long context helps (Golowich et al., ICML 2025), as
lengthgen operationalises it (docs/sparsity.md, "Sparse dependence in natural language").

For a model M trained at window 4L (the reference) and its per-token losses at the contexts
L (`near`, the smallest of eval.token_contexts) and 4L (`full`, the largest):
- long-context benefit  D(t) = loss(t; L) - loss(t; 4L);
- long-context tokens   T* = {t : D(t) > tau}, and the top_p % of D (both flagged per token);
- far tokens of t: the full - near tokens before its near window (distances near + 1 .. full),
  ranked by M's attention from t (`rank = "attention"`: the weight t's query gives each of
  them in the full pass, summed over layers, averaged over heads) or by how much dropping each
  alone raises t's loss (`rank = "leave_one_out"`);
- dependence sparsity   k(t) = the fewest top-ranked far tokens that, kept with the near L
  (every token at its original position ID, lengthgen.evaluation.language_model.ablated_losses), recover at least
  (1 - epsilon) of D(t): loss(t; L) - loss(t; near + top k) >= (1 - epsilon) D(t).
k is found by bisection on [0, full - near], which assumes that recovery grows with the number
of ranked far tokens kept; keeping all of them recovers D(t) exactly (the full context), keeping
none recovers nothing, so the search is always bracketed. Only the tokens of T* are searched.

Writes RUN/dependence.csv (a row per token of T*: document, position, token, delta, in_tau,
in_top, k, recovery at k, and the distances of the k far tokens kept) and its costs into
RUN/token_eval.json.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from lengthgen.config.dependence import Dependence
from lengthgen.config.schema import EvalConfig
from lengthgen.evaluation.language_model import Scorer, ablated_losses, documents
from lengthgen.model.attention import recording
from lengthgen.results.token_files import DEPENDENCE, TOKEN_EVAL, TOKEN_LOSS, write_cost, write_dependence, write_token_losses

RANDOM_SEED = 1234  # the random orders of the baseline: fixed, so an evaluation repeats exactly


def selected(delta: np.ndarray, tau: float, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """(D > tau, in the top top_p % of D and D > 0) as boolean masks."""
    in_tau = delta > tau
    in_top = np.zeros(len(delta), dtype=bool)
    count = int(round(len(delta) * top_p / 100))
    if count:
        order = np.argsort(-delta, kind="stable")[:count]
        in_top[order] = True
        in_top &= delta > 0
    return in_tau, in_top


@torch.no_grad()
def attention_ranks(scorer: Scorer, stream, index: np.ndarray, near: int, full: int) -> tuple[np.ndarray, int]:
    """Far distances (near + 1 .. full) of each token, ranked by the attention its query gives
    them in the full pass (summed over layers, mean over heads), most attended first; and the
    passes run. (N, full - near)."""
    from lengthgen.evaluation.language_model import rows_batch

    ranks = np.zeros((len(index), full - near), dtype=np.int64)
    rows = max(1, scorer.batch_tokens // full)
    offsets = np.arange(-full, 0)
    for first in range(0, len(index), rows):
        chunk = index[first:first + rows]
        columns = chunk[:, None] + offsets[None, :]
        batch, last = rows_batch(stream, columns, np.full(len(chunk), full),
                                 np.broadcast_to(np.arange(full), columns.shape), chunk)
        with recording(scorer.model, last_only=True) as recorder:
            scorer.method.last_logits(scorer.model, batch.to(scorer.device), last.to(scorer.device))
        mass = sum(chunks[-1][:, :, -1, :].float().mean(1) for chunks in recorder.weights.values())  # (rows, full)
        far = mass[:, :full - near].cpu().numpy()  # column j is distance full - j
        order = np.argsort(-far, axis=1, kind="stable")
        ranks[first:first + len(chunk)] = full - order
    return ranks, len(index)


def leave_one_out_ranks(scorer: Scorer, stream, index: np.ndarray, near: int, full: int,
                        full_loss: np.ndarray) -> tuple[np.ndarray, int]:
    """Far distances of each token ranked by how much dropping that one far token alone raises
    its loss (largest first); full - near passes per token."""
    far_all = np.arange(near + 1, full + 1)
    ranks = np.zeros((len(index), len(far_all)), dtype=np.int64)
    for i, t in enumerate(index):
        drops = [np.delete(far_all, j) for j in range(len(far_all))]
        losses = ablated_losses(scorer, stream, np.full(len(far_all), t), drops, near, full)
        order = np.argsort(-(losses - full_loss[i]), kind="stable")
        ranks[i] = far_all[order]
    return ranks, len(index) * len(far_all)


def bisect_k(loss_of, ranks: np.ndarray, near_loss: np.ndarray, full_loss: np.ndarray,
             epsilon: float) -> tuple[np.ndarray, np.ndarray, int]:
    """For each token b: the fewest m of its ranked far tokens ranks[b, :m] whose loss
    `loss_of(rows, m)` recovers at least (1 - epsilon) of near_loss - full_loss, by bisection
    on [0, F] (F = every far token, which recovers it all by definition). `loss_of(rows, m)`
    returns the losses of tokens `rows` with their top m[r] far tokens kept. Returns k, the loss
    at k, and the probes run (tokens x steps)."""
    n, F = ranks.shape
    need = (1 - epsilon) * (near_loss - full_loss)
    lo, hi = np.zeros(n, dtype=np.int64), np.full(n, F, dtype=np.int64)
    at_hi = full_loss.astype(np.float64).copy()
    probes = 0
    while True:
        active = np.flatnonzero(hi - lo > 1)
        if not len(active):
            break
        mid = (lo[active] + hi[active]) // 2
        losses = loss_of(active, mid)
        probes += len(active)
        ok = near_loss[active] - losses >= need[active]
        hi[active[ok]], at_hi[active[ok]] = mid[ok], losses[ok]
        lo[active[~ok]] = mid[~ok]
    return hi, at_hi, probes


def measure(scorer: Scorer, stream, losses: dict[str, np.ndarray], contexts: list[int],
            options: dict) -> tuple[list[dict], dict]:
    """The rows of dependence.csv for the tokens of `losses` (lengthgen.evaluation.language_model.token_losses, which
    must be the scored tokens of `stream` at these contexts) and what the search cost."""
    settings = Dependence(**options)
    near, full = min(contexts), max(contexts)
    start = time.perf_counter()
    delta = losses[f"loss_{near}"] - losses[f"loss_{full}"]
    in_tau, in_top = selected(delta, settings.tau, settings.top_p)
    chosen = np.flatnonzero(in_tau | in_top)
    if settings.max_tokens and len(chosen) > settings.max_tokens:
        chosen = chosen[np.unique(np.linspace(0, len(chosen) - 1, settings.max_tokens).round().astype(np.int64))]
    starts, _ = documents(stream)
    index = starts[losses["document"][chosen]] + losses["position"][chosen]  # each token's place in the stream
    near_loss, full_loss = losses[f"loss_{near}"][chosen], losses[f"loss_{full}"][chosen]
    if settings.rank == "attention":
        ranks, rank_passes = attention_ranks(scorer, stream, index, near, full)
    else:
        ranks, rank_passes = leave_one_out_ranks(scorer, stream, index, near, full, full_loss)

    def search(order: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        def loss_of(rows, m):
            return ablated_losses(scorer, stream, index[rows], [order[r, :c] for r, c in zip(rows, m)], near, full)

        return bisect_k(loss_of, order, near_loss, full_loss, settings.epsilon) if len(chosen) else \
            (np.zeros(0, np.int64), np.zeros(0), 0)

    k, at_k, probes = search(ranks)
    k_random, more = np.full(len(chosen), -1), 0
    if settings.random_baseline:  # how many far tokens the same search needs without the ranking
        rng = np.random.default_rng(RANDOM_SEED)
        k_random, _, more = search(np.array([rng.permutation(row) for row in ranks]).reshape(ranks.shape))
    rows = [{"document": int(losses["document"][c]), "position": int(losses["position"][c]),
             "token": int(losses["token"][c]), "delta": float(delta[c]), "in_tau": bool(in_tau[c]),
             "in_top": bool(in_top[c]), "k": int(k[i]),
             "recovery": float((near_loss[i] - at_k[i]) / (near_loss[i] - full_loss[i])),
             "far": [int(d) for d in ranks[i, :k[i]]], "k_random": int(k_random[i])} for i, c in enumerate(chosen)]
    cost = {"tokens": int(len(chosen)), "of_scored": int(len(delta)), "rank": settings.rank,
            "rank_passes": int(rank_passes), "bisection_passes": int(probes), "random_passes": int(more),
            "seconds": time.perf_counter() - start, "settings": asdict(settings), "near": near, "full": full}
    return rows, cost


def evaluate_tokens(out: Path, ev: EvalConfig, task, scorer: Scorer, step: int = -1) -> dict | None:
    """The per-token evaluation of a run's config (eval.token_*) -> out/token_loss.csv, and with
    eval.dependence the search for k -> out/dependence.csv; their costs -> out/token_eval.json.
    Skipped (None) when token_eval.json records the same settings for the same checkpoint `step`
    and the files are there: `lengthgen eval RUN --lengths 8192` does not pay for them again."""
    from lengthgen.evaluation.language_model import token_losses

    out = Path(out)
    settings = {"step": step, "contexts": list(ev.token_contexts), "stride": ev.token_stride, "limit": ev.token_limit,
                "dependence": ev.dependence, "options": asdict(Dependence(**ev.dependence_options))}
    files = [out / TOKEN_LOSS] + ([out / DEPENDENCE] if ev.dependence else [])
    try:
        done = json.loads((out / TOKEN_EVAL).read_text()).get("settings")
    except (OSError, ValueError, AttributeError):
        done = None
    if done == settings and all(f.is_file() for f in files):
        print(f"note: {out / TOKEN_EVAL} records this evaluation of step {step}; per-token files kept", file=sys.stderr)
        return None
    start = time.perf_counter()
    losses = token_losses(task, scorer, ev.token_contexts, ev.token_stride, ev.token_limit)
    seconds = time.perf_counter() - start
    write_token_losses(out / TOKEN_LOSS, losses)
    n = len(losses["document"])
    cost = {"tokens": n, "contexts": list(ev.token_contexts), "stride": ev.token_stride, "limit": ev.token_limit,
            "passes": n * len(ev.token_contexts), "positions": n * sum(ev.token_contexts), "seconds": seconds,
            "seconds_per_1000_tokens": 1000 * seconds / max(n, 1)}
    (out / TOKEN_EVAL).unlink(missing_ok=True)  # costs of an earlier evaluation do not describe this one
    write_cost(out / TOKEN_EVAL, "token_losses", cost)
    (out / DEPENDENCE).unlink(missing_ok=True)
    if ev.dependence:
        rows, cost = measure(scorer, task.corpus.tokens("test"), losses, ev.token_contexts, ev.dependence_options)
        write_dependence(out / DEPENDENCE, rows)
        cost["seconds_per_1000_tokens"] = 1000 * cost["seconds"] / max(cost["tokens"], 1)
        write_cost(out / TOKEN_EVAL, "dependence", cost)
    write_cost(out / TOKEN_EVAL, "settings", settings)  # last: a killed search is never taken as done
    return losses
