"""The attention of the content schemes, computed whole (their `attend` hook): Threshold
Relative Attention and CoPE. Queries run in chunks so a long window never holds a (T, T) tensor;
each chunk may hand its weights to a recorder (`keep`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lengthgen.model.attention import NO_DROPOUT, AttentionDropout


# A chunk of c queries holds several (rows, c, T) float tensors at once; with many rows
# (an evaluation batch of 256 at T = 512) c = 512 made 1 GB tensors. So a chunk is also
# capped at this many scores (16 MiB per float32 tensor): on CPU, 2^22 ran CoPE's and TRA's
# forward + backward 3x faster than 2^24 at the mini block's training shape (batch 64,
# window 256) and their inference at batch 256, window 512, 3-4x faster (2^20: no faster).
MAX_CHUNK_SCORES = 2 ** 22


def query_spans(T: int, chunk: int, rows: int = 1) -> list[tuple[int, int]]:
    """[start, end) of each chunk of queries. chunk 0 = all T at once; otherwise at most
    `chunk` queries and at most MAX_CHUNK_SCORES scores over `rows` (batch x heads) rows."""
    if chunk:
        chunk = max(1, min(chunk, MAX_CHUNK_SCORES // (rows * T)))
    else:
        chunk = T
    return [(s, min(T, s + chunk)) for s in range(0, T, chunk)]


def tra_attention(q: Tensor, k: Tensor, v: Tensor, gate_logit: Tensor, chunk: int = 0,
                  dropout: AttentionDropout = NO_DROPOUT, keep: list | None = None, keep_last: bool = False) -> Tensor:
    """Threshold Relative Attention (Opper et al., TMLR 2025), causal, per head.

    q, k, v (B, H, T, Dh); gate_logit (B, H, T), the forget gate before its logsigmoid.
    q and k are RMS-normalised over Dh (no learned scale); s_ij = relu(q_i . k_j / sqrt(Dh));
    keys with s_ij = 0 and future keys are dropped; n_ij = the number of kept keys m with
    j <= m <= i (the most recent kept key has 1); logits s_ij + n_ij * logsigmoid(gate_i)
    over the kept keys, softmax, and a row with no kept key outputs 0. Returns (B, H, T, Dh).

    Queries run `chunk` at a time (0 = all at once; fewer if the batch is large, see
    `query_spans`): a chunk of c queries sees only the
    keys up to its last query, so memory is O(c * T), never (T, T), and the result is the
    same. `keep`, if a list, gets each chunk's attention weights (B, H, c, keys), detached
    (with `keep_last`, only the last query's row, (B, H, 1, T))."""
    Dh, T = q.shape[-1], q.shape[-2]
    q, k = F.rms_norm(q, (Dh,)), F.rms_norm(k, (Dh,))
    gate = F.logsigmoid(gate_logit.float())[..., None]  # (B, H, T, 1), <= 0: forgetting grows with distance
    out = []
    for s, e in query_spans(T, chunk, q.shape[0] * q.shape[1]):
        raw = (q[:, :, s:e] @ k[:, :, :e].transpose(-2, -1)).float() * Dh ** -0.5  # (B, H, c, e)
        causal = torch.arange(e, device=q.device)[None, :] <= torch.arange(s, e, device=q.device)[:, None]
        kept = (raw > 0) & causal  # relu(raw) = 0 drops the key; where kept, relu(raw) = raw
        counts = kept.cumsum(-1, dtype=raw.dtype)  # kept keys in [0, j]; the last column: all up to i
        distance = counts[..., -1:] - counts + kept  # kept keys in [j, i]
        dead = counts[..., -1:] == 0  # (B, H, c, 1): a query that kept no key
        # a dead row keeps its raw scores (finite, so no NaN anywhere) and its output is zeroed below
        logits = dropout.logits(torch.addcmul(raw, distance, gate[:, :, s:e]))  # the notebook's dropout(S + D)
        att = torch.softmax(torch.where(kept | dead, logits, float("-inf")), dim=-1)
        if keep is not None and (not keep_last or e == T):
            weights = att.masked_fill(dead, 0.0).detach()
            keep.append(weights[..., -1:, :] if keep_last else weights)
        y = dropout.weights(att).to(v.dtype) @ v[:, :, :e]  # (B, H, c, Dh)
        out.append(y.masked_fill(dead, 0.0))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def cope_attention(q: Tensor, k: Tensor, v: Tensor, pos_emb: Tensor, npos_max: int, chunk: int = 0,
                   dropout: AttentionDropout = NO_DROPOUT, keep: list | None = None, keep_last: bool = False) -> Tensor:
    """Contextual position encoding (Golovneva et al., 2024), causal.

    q, k, v (B, H, T, Dh); pos_emb (Dh, npos_max), the position vectors E[p].
    Gates g_ij = sigmoid(q_i . k_j / sqrt(Dh)) for j <= i (0 for the future); positions
    p_ij = sum_{m=j..i} g_im, clamped to npos_max - 1; z_i[p] = q_i . E[p] at integer p,
    linearly interpolated between floor(p) and ceil(p); logits (q_i . k_j + z_i[p_ij]) / sqrt(Dh).
    Returns (B, H, T, Dh). Queries run `chunk` at a time (0 = all), and `keep` records, as in
    `tra_attention`."""
    Dh, T = q.shape[-1], q.shape[-2]
    out = []
    for s, e in query_spans(T, chunk, q.shape[0] * q.shape[1]):
        qc = q[:, :, s:e]
        dots = (qc @ k[:, :, :e].transpose(-2, -1)).float()  # (B, H, c, e)
        causal = torch.arange(e, device=q.device)[None, :] <= torch.arange(s, e, device=q.device)[:, None]
        gates = torch.sigmoid(dots * Dh ** -0.5).masked_fill(~causal, 0.0)
        sums = gates.cumsum(-1)  # gates of keys [0, j]; the last column: all up to i
        pos = (sums[..., -1:] - sums + gates).clamp(max=npos_max - 1)  # gates of keys [j, i], (B, H, c, e)
        z = (qc @ pos_emb.to(qc.dtype)).float()  # (B, H, c, npos_max): q . E[p] at every integer p
        low = pos.floor()
        frac = pos - low
        low = low.long()
        high = (low + 1).clamp(max=npos_max - 1)
        z_at = z.gather(-1, high) * frac + z.gather(-1, low) * (1 - frac)  # (B, H, c, e)
        logits = dropout.logits((dots + z_at) * Dh ** -0.5).masked_fill(~causal, float("-inf"))
        att = torch.softmax(logits, dim=-1)  # every query keeps itself: no empty row
        if keep is not None and (not keep_last or e == T):
            keep.append((att[..., -1:, :] if keep_last else att).detach())
        out.append(dropout.weights(att).to(v.dtype) @ v[:, :, :e])
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)
