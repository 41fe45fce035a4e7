"""The attention of the content schemes, computed whole (their `attend` hook): Threshold
Relative Attention, CoPE and stick-breaking attention. Queries run in chunks so a long window
never holds a (T, T) tensor; each chunk may hand its weights to a recorder (`keep`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lengthgen.model.attention import NO_DROPOUT, AttentionDropout, masked_softmax


# A chunk of c queries holds several (rows, c, T) float tensors at once; with many rows
# (an evaluation batch of 256 at T = 512) c = 512 made 1 GB tensors. So a chunk is also
# capped at this many scores (16 MiB per float32 tensor): on CPU, 2^22 ran CoPE's and TRA's
# forward + backward 3x faster than 2^24 at the mini block's training shape (batch 64,
# window 256) and their inference at batch 256, window 512, 3-4x faster (2^20: no faster).
MAX_CHUNK_SCORES = 2 ** 22
# On a GPU, memory is not what limits a chunk and every chunk is another round of launches: the
# TRA paper's training shape (64 x 4 rows, window 256, 2^24 scores) runs as one chunk.
MAX_CHUNK_SCORES_CUDA = 2 ** 26


def query_spans(T: int, chunk: int, rows: int = 1, cuda: bool = False) -> list[tuple[int, int]]:
    """[start, end) of each chunk of queries. chunk 0 = all T at once; otherwise at most
    `chunk` queries and at most MAX_CHUNK_SCORES (on CUDA MAX_CHUNK_SCORES_CUDA) scores over
    `rows` (batch x heads) rows."""
    if chunk:
        cap = MAX_CHUNK_SCORES_CUDA if cuda else MAX_CHUNK_SCORES
        chunk = max(1, min(chunk, cap // (rows * T)))
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
    for s, e in query_spans(T, chunk, q.shape[0] * q.shape[1], q.is_cuda):
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


def cope_attention(q: Tensor, k: Tensor, v: Tensor, pos_emb: Tensor, chunk: int = 0,
                   dropout: AttentionDropout = NO_DROPOUT, keep: list | None = None, keep_last: bool = False) -> Tensor:
    """Contextual position encoding (Golovneva et al., 2024), causal.

    q, k, v (B, H, T, Dh); pos_emb (Dh, npos_max), the position vectors E[p] (its width is npos_max).
    Gates g_ij = sigmoid(q_i . k_j / sqrt(Dh)) for j <= i (0 for the future); positions
    p_ij = sum_{m=j..i} g_im, clamped to npos_max - 1; z_i[p] = q_i . E[p] at integer p,
    linearly interpolated between floor(p) and ceil(p); logits (q_i . k_j + z_i[p_ij]) / sqrt(Dh).
    Returns (B, H, T, Dh). Queries run `chunk` at a time (0 = all), and `keep` records, as in
    `tra_attention`."""
    Dh, T, npos_max = q.shape[-1], q.shape[-2], pos_emb.shape[-1]
    out = []
    for s, e in query_spans(T, chunk, q.shape[0] * q.shape[1], q.is_cuda):
        qc = q[:, :, s:e]
        dots = (qc @ k[:, :, :e].transpose(-2, -1)).float()  # (B, H, c, e)
        causal = torch.arange(e, device=q.device)[None, :] <= torch.arange(s, e, device=q.device)[:, None]
        gates = torch.sigmoid(dots * Dh ** -0.5).masked_fill(~causal, 0.0)
        sums = gates.cumsum(-1)  # gates of keys [0, j]; the last column: all up to i
        # gates of keys [j, i], (B, H, c, e); >= 0 but for rounding, which a fused cumsum can take below 0
        pos = (sums[..., -1:] - sums + gates).clamp(min=0, max=npos_max - 1)
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


def fox_attention(q: Tensor, k: Tensor, v: Tensor, gate_logit: Tensor, dropout: AttentionDropout = NO_DROPOUT) -> Tensor:
    """The Forgetting Transformer's attention (lengthgen.model.positions.FoX), whole: logits
    q . k / sqrt(Dh) + sum of log f over l = j+1..i, causal, softmax, weights @ v. gate_logit (B, H, T)."""
    T = q.shape[-2]
    cumulative = F.logsigmoid(gate_logit.float()).cumsum(-1)  # (B, H, T)
    logits = (q @ k.transpose(-2, -1)).float() * q.shape[-1] ** -0.5 + (cumulative[..., :, None] - cumulative[..., None, :])
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = dropout.weights(masked_softmax(dropout.logits(logits.masked_fill(future, float("-inf")))))
    return att.to(v.dtype) @ v


def stick_breaking_attention(q: Tensor, k: Tensor, v: Tensor, chunk: int = 0, dropout: AttentionDropout = NO_DROPOUT,
                             keep: list | None = None, keep_last: bool = False) -> Tensor:
    """Stick-breaking attention (Tan et al., ICLR 2025), causal, per head, without positions.

    q, k, v (B, H, T, Dh). For query i and each earlier key j < i, beta_ij = sigmoid(z_ij),
    z_ij = q_i . k_j / sqrt(Dh); the nearest key breaks the stick first:
    A_ij = beta_ij * prod_{j<m<i} (1 - beta_im), in log space
    logsigmoid(z_ij) + sum_{j<m<i} logsigmoid(-z_im). As the reference's default
    (attend_current = False), the query's own key is no stick-breaker: what is left of the stick,
    1 - sum_j A_ij = prod_{j<i} (1 - beta_ij), goes to the query's own value v_i (the reference's
    tests add rem * v), so every row's weights sum to 1 and the first query outputs v_0.

    The sums over keys run from the query backwards (a reversed cumsum), as the reference's
    kernel accumulates: the nearest keys' weights, the ones that matter, stay exact in float32
    however much of the stick the far keys broke (a forward cumsum's difference of two large
    sums would round them). The remainder is the exp of the whole row's sum, never 1 - sum A,
    which rounds to a small negative number when little is left.

    Dropout on `logits` drops z: a dropped key's beta becomes 1/2 (it takes half of what is left),
    the kept z are scaled by 1 / (1 - p); on `weights` it drops the weights, remainder included.
    Queries run `chunk` at a time and `keep` records the weights (the remainder on the diagonal),
    as in `tra_attention`. Returns (B, H, T, Dh)."""
    Dh, T = q.shape[-1], q.shape[-2]
    out = []
    for s, e in query_spans(T, chunk, q.shape[0] * q.shape[1], q.is_cuda):
        z = dropout.logits((q[:, :, s:e] @ k[:, :, :e].transpose(-2, -1)).float() * Dh ** -0.5)  # (B, H, c, e)
        keys, queries = torch.arange(e, device=q.device)[None, :], torch.arange(s, e, device=q.device)[:, None]
        earlier = keys < queries  # (c, e): the stick-breakers of each query
        miss = F.logsigmoid(-z).masked_fill(~earlier, 0.0)  # log(1 - beta): the part of the stick a key leaves
        behind = miss.flip(-1).cumsum(-1).flip(-1)  # sum over keys m >= j, accumulated from the query back
        between = F.pad(behind[..., 1:], (0, 1))  # keys j < m < i: the sum from the next key on
        log_weights = torch.where(earlier, F.logsigmoid(z) + between,
                                  torch.where(keys == queries, behind[..., :1], float("-inf")))  # the remainder
        att = log_weights.exp()  # (B, H, c, e), each row sums to 1
        if keep is not None and (not keep_last or e == T):
            keep.append((att[..., -1:, :] if keep_last else att).detach())
        out.append(dropout.weights(att).to(v.dtype) @ v[:, :, :e])
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


ATTENTIONS = {"tra": tra_attention, "cope": cope_attention, "fox": fox_attention,
              "stickbreaking": stick_breaking_attention}
# How a content scheme's attention is fused for training on CUDA: a function from the eager
# attention to an equal, faster one (lengthgen.accel installs inductor's); None: eager everywhere.
FUSER = None
_FUSED: dict = {}


def fused(name: str):
    """The attention `name` of ATTENTIONS as FUSER makes it, once per process, or the eager one
    where no fuser is installed. The schemes use it for training on CUDA (`fuses`); evaluation,
    whose lengths change from call to call, and recording stay eager."""
    if FUSER is None:
        return ATTENTIONS[name]
    if name not in _FUSED:
        _FUSED[name] = FUSER(ATTENTIONS[name])
    return _FUSED[name]


def fuses(q: Tensor, keep: list | None) -> bool:
    """Whether a scheme's attention runs fused: training on CUDA, nothing recorded."""
    return q.is_cuda and keep is None and torch.is_grad_enabled()
