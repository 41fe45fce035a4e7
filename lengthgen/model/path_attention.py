"""PaTH attention (Yang et al., NeurIPS 2025, "PaTH Attention: Position Encoding via Accumulating
Householder Transformations"), the schemes `path` and `path-fox`, instead of any positional encoding.

Each token t writes a Householder-like transform H_t = I - beta_t w_t w_t^T (per head: w_t a unit
vector, beta_t = 2 sigmoid(.) in (0, 2), so H_t can flip a direction), and the score of key j for
query i is

    S_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j        (j <= i; the empty product for j = i),

data-dependent where RoPE's rotation is fixed. `path-fox` adds the Forgetting Transformer's decay
D_ij = sum_{l = j+1..i} log f_l (lengthgen.model.positions.FoX). Logits are (S + D) / sqrt(Dh): the
decay too is inside the scale, as flash-linear-attention's reference and kernel compute it.

w_t = normalize(silu(conv(W_w x_t))) with a causal depthwise convolution over the last `conv`
tokens, beta_t = 2 sigmoid(W_b x_t + b), f_t = sigmoid(W_f x_t + b), as fla's PaTHAttention layer
(which makes W_w low-rank, rank 32, to save parameters at large widths; here it is full, d_model
square). Three ways to compute S, checked equal in tests/model/test_path_attention.py:

- `reference_scores`: the definition, each product of Dh x Dh matrices formed; O(T^2 Dh^3), tests only.
- `attend` (training and evaluation): the chunked form of the paper. Within a chunk of C tokens
  the transforms' product is I - W^T Z with Z = (I + L)^-1 diag(beta) W, L the strictly lower
  beta_s w_s . w_r (one triangular solve); queries then cross the earlier chunks one product at a
  time, so a query chunk costs O(T (C + Dh)) and memory is O(C T), never (T, T).
- `attend_cached` (decoding with a KV cache): the recurrence. Each new token's H updates every
  cached key, k_j <- k_j - beta_t (k_j . w_t) w_t, then the query meets the keys as they stand.

On CUDA with `fla` installed, bf16 or fp16 training and evaluation without recording or dropout run
fla's Triton kernel (`fla.ops.path_attn`), tested equal to the chunked form where a GPU and fla are
present; in fp32, and everywhere else, the chunked form runs.
"""
from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.scheme_base import PositionalScheme


def reference_scores(q: Tensor, k: Tensor, w: Tensor, beta: Tensor) -> Tensor:
    """S_ij = q_i^T H_i ... H_{j+1} k_j from the definition, each product formed as a matrix.
    q, k, w (B, H, T, Dh), beta (B, H, T) -> (B, H, T, T) float32, -inf above the diagonal."""
    q, k, w, beta = q.float(), k.float(), w.float(), beta.float()
    B, nh, T, D = q.shape
    eye = torch.eye(D, device=q.device)
    transforms = eye - beta[..., None, None] * w[..., :, None] * w[..., None, :]  # (B, H, T, D, D): H_t
    scores = q.new_full((B, nh, T, T), float("-inf"), dtype=torch.float32)
    for i in range(T):
        product = eye.expand(B, nh, D, D)  # H_i ... H_{j+1}, the identity for j = i
        for j in range(i, -1, -1):
            scores[:, :, i, j] = (q[:, :, i, None, :] @ product @ k[:, :, j, :, None])[..., 0, 0]
            product = product @ transforms[:, :, j]
    return scores


def _chunked(x: Tensor, chunk: int) -> Tensor:
    """(B, H, T, ...) -> (B, H, n, chunk, ...), zeros after the last token (an H of beta 0 is I)."""
    T = x.shape[2]
    n = -(-T // chunk)
    pad = [0, 0] * (x.dim() - 3) + [0, n * chunk - T]
    return F.pad(x, pad).view(*x.shape[:2], n, chunk, *x.shape[3:])


def chunk_terms(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk: int) -> tuple[Tensor, ...]:
    """Per chunk of `chunk` tokens (B, H, n, C, ...), all float32:
    local   the scores inside the chunk (valid on and below the diagonal),
    q_in    each query carried through its chunk's transforms up to itself (q_i^T H_i ... H_first),
    k_out   each key carried through the transforms after it in its chunk (H_last ... H_{j+1} k_j),
    w, z    the chunk's whole product is I - w^T z (applied to a row vector: r <- r - (r w^T) z).
    With one chunk only `local` is computed (the rest is None): nothing crosses a chunk."""
    q, k, w = (_chunked(t.float(), chunk) for t in (q, k, w))
    beta = _chunked(beta.float(), chunk)
    wb = w * beta[..., None]  # rows beta_s w_s
    # masks as float factors: a multiply is several times cheaper than tril on many small matrices
    below = torch.ones(chunk, chunk, device=q.device).tril(-1)
    lower = torch.eye(chunk, device=q.device) + (wb @ w.transpose(-2, -1)) * below  # I + L, unit lower triangular
    taken = (wb @ k.transpose(-2, -1)) * below  # beta_s w_s . k_j for s > j
    one = q.shape[2] == 1
    solved = torch.linalg.solve_triangular(lower, taken if one else torch.cat([taken, wb], dim=-1), upper=False,
                                           unitriangular=True)  # (I + L)^-1 [taken | diag(beta) W]
    y = solved[..., :chunk]  # y[s, j]: what w_s takes from key j, as the transforms between them left it
    qw = (q @ w.transpose(-2, -1)) * (below + torch.eye(chunk, device=q.device))  # q_i . w_s for s <= i
    local = q @ k.transpose(-2, -1) - qw @ y
    if one:
        return local, None, None, None, None
    z = solved[..., chunk:]
    return local, q - qw @ z, k - y.transpose(-2, -1) @ w, w, z


def score_rows(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk: int):
    """Yield (start, end, scores (B, H, end - start, end)) for each chunk of queries: the raw S of
    those queries against every key up to the chunk's end, float32, future keys unmasked."""
    T = q.shape[2]
    chunk = min(chunk, T)  # a shorter sequence is one chunk of its own length, no padding to solve through
    local, q_in, k_out, w_c, z = chunk_terms(q, k, w, beta, chunk)
    for c in range(local.shape[2]):
        start, end = c * chunk, min((c + 1) * chunk, T)
        blocks, running = [local[:, :, c]], None if q_in is None else q_in[:, :, c]
        for earlier in range(c - 1, -1, -1):  # the query crosses chunk `earlier`'s whole product after scoring it
            blocks.append(running @ k_out[:, :, earlier].transpose(-2, -1))
            running = running - (running @ w_c[:, :, earlier].transpose(-2, -1)) @ z[:, :, earlier]
        row = torch.cat(blocks[::-1], dim=-1) if len(blocks) > 1 else blocks[0]
        yield start, end, row[:, :, :end - start, :end]


def path_scores(q: Tensor, k: Tensor, w: Tensor, beta: Tensor, chunk: int = 64) -> Tensor:
    """The chunked form's S as one (B, H, T, T) float32 tensor, -inf above the diagonal (tests)."""
    T = q.shape[2]
    rows = [F.pad(row, (0, T - end), value=0.0) for _, end, row in score_rows(q, k, w, beta, chunk)]
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.cat(rows, dim=2).masked_fill(future, float("-inf"))


def fla_kernel():
    """fla's PaTH attention function, or None where fla is not installed."""
    try:
        from fla.ops.path_attn import parallel as fla_parallel
    except Exception:  # ImportError, or a Triton that cannot load on this machine
        return None
    return getattr(fla_parallel, "parallel_path_attn", None) or getattr(fla_parallel, "parallel_path_attention", None)


class PaTH(PositionalScheme):
    """`conv`: the short convolution's width over w's projection (3, fla's; 0 or 1: none).
    `chunk`: tokens per chunk of the chunked form (32); a sequence no longer runs as one chunk. 32 was
    the fastest training step at 128 tokens on CPU (width 64, 4 heads, batch 32, one thread: 505 ms
    a step, against 589 at 24, 615 at 16, 677 at 64 and 967 at 128; RoPE's 246): the triangular
    solve grows as chunk^3, the crossings between chunks as (T / chunk)^2."""

    has_content = True
    bidirectional = False  # the product runs over the tokens between key and query, in order
    forget = False  # path-fox: the Forgetting Transformer's gate as well

    @classmethod
    def cacheable(cls) -> bool:
        return True

    def __init__(self, cfg: ModelConfig, conv: int = 3, chunk: int = 32):
        super().__init__(cfg)
        for key, value, low in (("conv", conv, 0), ("chunk", chunk, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{cfg.position} {key} must be an integer >= {low}, got {value!r}")
        self.conv, self.chunk = max(conv, 1), chunk
        D, H = cfg.d_model, cfg.n_head
        self.w_proj = nn.ModuleList(nn.Linear(D, D, bias=False) for _ in range(cfg.n_layer))
        self.w_conv = nn.ModuleList(nn.Conv1d(D, D, self.conv, groups=D, bias=False)
                                    for _ in range(cfg.n_layer)) if self.conv > 1 else None
        self.beta_proj = nn.ModuleList(nn.Linear(D, H) for _ in range(cfg.n_layer))
        self.gates = nn.ModuleList(nn.Linear(D, H) for _ in range(cfg.n_layer)) if self.forget else None

    def directions(self, x: Tensor, layer: int, before: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Block input x (B, T, D) -> the projections u (B, T, D) before the convolution and the unit
        w (B, H, T, Dh). `before`: the projections of the conv - 1 tokens preceding x (zeros if None)."""
        B, T, D = x.shape
        u = self.w_proj[layer](x)
        if self.w_conv is not None:
            if before is None:
                before = u.new_zeros(B, self.conv - 1, D)
            window = torch.cat([before, u], dim=1).transpose(1, 2)  # (B, D, conv - 1 + T)
            u_conv = F.silu(self.w_conv[layer](window)).transpose(1, 2)  # (B, T, D): causal, no padding after
        else:
            u_conv = u
        w = u_conv.view(B, T, self.n_head, self.head_dim).transpose(1, 2).float()
        w = w * torch.rsqrt(w.square().sum(-1, keepdim=True).clamp_min(1e-12))  # unit (F.normalize, cheaper)
        return u, w

    def betas(self, x: Tensor, layer: int) -> Tensor:
        """(B, T, D) -> beta (B, H, T) in (0, 2)."""
        return 2 * torch.sigmoid(self.beta_proj[layer](x).float()).transpose(1, 2)

    def log_forget(self, x: Tensor, layer: int) -> Tensor | None:
        """(B, T, D) -> log f (B, H, T) <= 0, or None without the gate."""
        return F.logsigmoid(self.gates[layer](x).float()).transpose(1, 2) if self.forget else None

    def attend(self, q, k, v, x, layer, dropout, recorder=None):
        _, w = self.directions(x, layer)
        beta, log_f = self.betas(x, layer), self.log_forget(x, layer)
        scale = q.shape[-1] ** -0.5
        if (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and recorder is None and not dropout.p
                and (kernel := fla_kernel()) is not None):  # fla's Triton kernels take half precision
            out, _ = kernel(q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2), w=w.transpose(1, 2).to(q.dtype),
                            beta=beta.transpose(1, 2), g=None if log_f is None else log_f.transpose(1, 2), scale=scale)
            return out.transpose(1, 2)
        cumulative = None if log_f is None else log_f.cumsum(-1)  # (B, H, T)
        keep = recorder.chunks(layer) if recorder is not None else None
        T, out = q.shape[2], []
        for start, end, scores in score_rows(q, k, w, beta, self.chunk):
            if cumulative is not None:
                scores = scores + (cumulative[:, :, start:end, None] - cumulative[:, :, None, :end])
            future = torch.arange(end, device=q.device)[None, :] > torch.arange(start, end, device=q.device)[:, None]
            logits = dropout.logits(scores * scale).masked_fill(future, float("-inf"))  # dropped, then masked
            att = dropout.weights(torch.softmax(logits, dim=-1))  # never an empty row: the query's own key
            if keep is not None and (not recorder.last_only or end == T):
                keep.append((att[..., -1:, :] if recorder.last_only else att).detach())
            out.append(att.to(v.dtype) @ v[:, :, :end])
        return out[0] if len(out) == 1 else torch.cat(out, dim=2)

    def attend_cached(self, q, k, v, x, layer, cache):
        """The recurrence, one new token at a time: every cached key meets the new token's H before
        the new query reads it. The cache keeps, per layer, the keys as the last token left them,
        the values, the decay's running sum and the last conv - 1 projections of w."""
        state = cache.state.get(layer)
        u, w = self.directions(x, layer, None if state is None else state["before"])
        beta, log_f = self.betas(x, layer), self.log_forget(x, layer)
        B, nh, _, D = k.shape
        keys = k.new_zeros(B, nh, 0, D, dtype=torch.float32) if state is None else state["keys"]
        values = v[:, :, :0] if state is None else state["values"]
        sums = q.new_zeros(B, nh, 0, dtype=torch.float32) if state is None else state["sums"]
        out = []
        for t in range(q.shape[2]):
            w_t = w[:, :, t, None, :]  # (B, H, 1, Dh)
            keys = keys - beta[:, :, t, None, None] * (keys * w_t).sum(-1, keepdim=True) * w_t
            keys = torch.cat([keys, k[:, :, t, None].float()], dim=2)
            values = torch.cat([values, v[:, :, t, None]], dim=2)
            last = sums[..., -1:] if sums.shape[-1] else sums.new_zeros(B, nh, 1)
            sums = torch.cat([sums, last + (log_f[:, :, t, None] if log_f is not None else 0.0)], dim=-1)
            scores = (q[:, :, t, None].float() @ keys.transpose(-2, -1))[:, :, 0]  # (B, H, keys)
            if log_f is not None:
                scores = scores + (sums[..., -1:] - sums)
            att = torch.softmax(scores * q.shape[-1] ** -0.5, dim=-1)
            out.append((att[:, :, None].to(v.dtype) @ values))  # (B, H, 1, Dh)
        before = torch.cat([u.new_zeros(B, self.conv - 1, u.shape[-1]) if state is None else state["before"], u], dim=1)
        cache.state[layer] = {"keys": keys, "values": values, "sums": sums,
                              "before": before[:, before.shape[1] - (self.conv - 1):]}
        return torch.cat(out, dim=2)


class PaTHFoX(PaTH):
    """PaTH with the Forgetting Transformer's gate (PaTH-FoX in the paper): per layer, a
    Linear(d_model, n_head) with a bias, torch's default init, as `fox`'s."""

    forget = True
