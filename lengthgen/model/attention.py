"""Self-attention with three paths, chosen by the positional scheme: causal, or bidirectional
with model.causal = false (an encoder: no mask at all; the schemes that cannot attend both ways,
and the KV cache, are refused before a run starts).

- dense:   no content hook -> `dense_attention`: softmax(q k^T / sqrt(Dh) + bias + mask) v, with
           the scheme's bias where it has one (ALiBi). The default is SDPA (flash / memory-efficient
           kernels where they apply); `BACKENDS` holds faster kernels for the shapes they know, tried
           first (lengthgen.accel adds them: model/ imports nothing from it).
- content: `scheme.has_content` -> the scheme computes the attention itself
           (`attend`: TRA and CoPE run `tra_attention` / `cope_attention` of content_attention.py,
           queries in chunks so a long window never holds a (T, T) tensor),
           or returns the full masked logits (`content_logits`), softmaxed in
           float32 here; a row with no kept key gives 0.
- cached:  decoding with a KV cache (`scheme.attend_cached`).

RoPE-style rotation is applied in every path, before the logits are formed.

Recording: inside `recording(model)`, every attention layer hands its weights to the
`AttentionRecorder` installed on it (layer -> list of (B, H, queries, keys) chunks, detached;
only the last query's row with `last_only`): the content schemes from inside their own
attention, the others by `attention_weights` beside the unchanged dense path, so a recorded
forward pass returns the same output as an unrecorded one.

Packed rows (`Packed`): the looped model's step-dependent loss keeps rows of
different widths as one (N, D) token array, so the per-token layers (LayerNorm,
the q/k/v and output projections, the MLP: nearly all the FLOPs) touch no
padding. Only attention pads them to (rows, widest) and back; padding sits
after each row's last token, so causal attention never lets it reach a real one.
"""
from __future__ import annotations

from contextlib import contextmanager

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.linear import Linear


@dataclass(frozen=True)
class AttentionDropout:
    """Where attention dropout acts (model.attn_dropout_on). `weights`: on the softmax's output,
    as GPT-2 and the TRA paper describe it. `logits`: on the logits before the mask and the
    softmax, as the TRA authors' notebook does (`A = dropout(S + D)`): a dropped logit becomes 0,
    the kept ones are scaled by 1 / (1 - p), and the mask keeps its support (a masked key stays
    out), but a dropped key can become the most attended one."""

    p: float = 0.0
    on: str = "weights"

    def logits(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p) if self.p and self.on == "logits" else x

    def weights(self, att: Tensor) -> Tensor:
        return F.dropout(att, self.p) if self.p and self.on == "weights" else att


NO_DROPOUT = AttentionDropout()


def causal_mask(T: int, device=None, dtype=torch.float32) -> Tensor:
    """(T, T) additive mask: 0 on and below the diagonal, -inf above it."""
    return torch.full((T, T), float("-inf"), device=device, dtype=dtype).triu(1)


def masked_softmax(logits: Tensor) -> Tensor:
    """Softmax over the last dim in float32; a row whose every logit is -inf
    gives all zeros instead of NaN (a content scheme may drop every key)."""
    logits = logits.float()
    dead = torch.isneginf(logits).all(dim=-1, keepdim=True)  # (..., T, 1)
    # Fill dead rows with 0 *before* the softmax so neither the forward nor the
    # backward pass ever sees NaN, then zero their weights.
    att = torch.softmax(logits.masked_fill(dead, 0.0), dim=-1)
    return att.masked_fill(dead, 0.0)


def no_mask(T: int, device=None, dtype=torch.float32) -> Tensor:
    """(T, T) zeros: the additive mask of bidirectional attention."""
    return torch.zeros(T, T, device=device, dtype=dtype)


def mask_of(causal: bool):
    """causal_mask, or no_mask for bidirectional attention."""
    return causal_mask if causal else no_mask


def biased_causal_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout: AttentionDropout,
                            causal: bool = True) -> Tensor:
    """softmax(dropout(q k^T / sqrt(Dh) + bias) + causal mask) v with dropout on the logits (the
    TRA notebook's): SDPA drops weights only. bias (B|1, H, T, T) or 0; `causal` false: no mask."""
    T, Dh = q.shape[-2], q.shape[-1]
    logits = dropout.logits((q @ k.transpose(-2, -1)).float() * Dh ** -0.5 + bias) + mask_of(causal)(T, q.device)
    return torch.softmax(logits, dim=-1).to(v.dtype) @ v


# Faster kernels for the dense path, tried in order before SDPA: each is
# backend(q, k, v, bias, dropout, causal) -> the output, or None where it does not apply, and each
# must equal `sdpa_attention` to float tolerance. lengthgen.accel.backends installs its own here.
BACKENDS: list = []


def dense_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout: AttentionDropout,
                    causal: bool = True) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + bias + mask) v for (B, H, T, Dh) inputs: the first of BACKENDS
    that takes the call, else SDPA. bias (B|1, H, T, T) or None; `causal` false: no mask."""
    for backend in BACKENDS:
        if (y := backend(q, k, v, bias, dropout, causal)) is not None:
            return y
    return sdpa_attention(q, k, v, bias, dropout, causal)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout: AttentionDropout,
                   causal: bool = True) -> Tensor:
    """The dense path's definition, on torch's SDPA; dropout on the logits (which SDPA cannot do)
    by `biased_causal_attention`."""
    if dropout.p and dropout.on == "logits":
        return biased_causal_attention(q, k, v, 0.0 if bias is None else bias, dropout, causal)
    if bias is not None:
        mask = bias + mask_of(causal)(q.shape[2], q.device)  # (B|1, H, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout.p)
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout.p, is_causal=causal)


def attention_weights(q: Tensor, k: Tensor, bias: Tensor | None = None, last: bool = False,
                      causal: bool = True) -> Tensor:
    """The causal softmax(q k^T / sqrt(Dh) + bias) weights the fast and bias paths compute inside
    SDPA, in float32: (B, H, T, T), or with `last` only the last query's row (B, H, 1, T), which
    costs O(T) and is what a per-token measurement needs. bias (B|1, H, T, T) or None; `causal` false:
    bidirectional weights."""
    T, Dh = q.shape[-2], q.shape[-1]
    if last:
        logits = (q[..., -1:, :] @ k.transpose(-2, -1)).float() * Dh ** -0.5  # (B, H, 1, T): all keys are before it
        return torch.softmax(logits if bias is None else logits + bias[..., -1:, :], dim=-1)
    logits = (q @ k.transpose(-2, -1)).float() * Dh ** -0.5 + mask_of(causal)(T, q.device)
    return torch.softmax(logits if bias is None else logits + bias, dim=-1)


class AttentionRecorder:
    """Each layer's attention weights while installed (`recording`): `weights[layer]`, a list of
    (B, H, queries, keys) chunks, detached; with `last_only`, only the last query's row
    (B, H, 1, T), which costs O(T) instead of O(T^2)."""

    def __init__(self, last_only: bool = False):
        self.weights: dict[int, list[Tensor]] = {}
        self.last_only = last_only

    def chunks(self, layer: int) -> list:
        """The list a scheme computing its own attention appends the layer's chunks to."""
        return self.weights.setdefault(layer, [])

    def add(self, layer: int, weights: Tensor) -> None:
        self.chunks(layer).append((weights[..., -1:, :] if self.last_only else weights).detach())


@contextmanager
def recording(model: nn.Module, last_only: bool = False):
    """Record the attention of every forward pass of `model` inside the block: an
    AttentionRecorder installed on each module with a `recorder` slot, removed on exit."""
    recorder, holders = AttentionRecorder(last_only), [m for m in model.modules() if hasattr(m, "recorder")]
    for module in holders:
        module.recorder = recorder
    try:
        yield recorder
    finally:
        for module in holders:
            module.recorder = None


class Packed:
    """Layout of k rows of widths w_r stored row after row as (N = sum w_r, C) tokens.

    Padding and unpadding split the tokens (or rows) into runs of equal-width
    rows (the looped loss sorts rows so that equal widths sit together) and
    concatenate the padded (or trimmed) runs: their backward passes are one
    concatenation and plain copies. One slice per run would cost a zero-filled
    gradient of the whole array per run in the backward pass; gathers with an
    index tensor (backward: index_put with accumulation) made a bf16 Parity
    step on CPU slower than no packing at all.

    `multiple`: the token array has `capacity` rows, the token count rounded up
    to this multiple; the extra rows are zeros that only the per-token layers
    see. Few distinct shapes matter on CPU in bf16, where oneDNN builds a new
    matmul kernel for every new shape: with an exact count every fresh batch
    brings new shapes, and a bf16 Parity step took 1.7x longer
    (benchmarks/speed/looped_speed.py --token-multiple 1).
    """

    def __init__(self, widths: list[int], multiple: int = 1):
        self.widths = list(widths)  # each row's width, in row order
        self.rows, self.width, self.tokens = len(widths), max(widths), sum(widths)
        self.capacity = -(-self.tokens // multiple) * multiple
        self.runs: list[tuple[int, int]] = []  # (rows, width) of each run of equal-width rows
        for w in widths:
            if self.runs and self.runs[-1][1] == w:
                self.runs[-1] = (self.runs[-1][0] + 1, w)
            else:
                self.runs.append((1, w))
        self.uniform = len(self.runs) == 1 and self.capacity == self.tokens

    def pad(self, x: Tensor) -> Tensor:
        """(capacity or tokens, C) tokens -> (k, W, C) rows, zeros past each row's end."""
        if self.uniform:  # every row one width (one length per batch): a view, and no graph break
            return x.view(self.rows, self.width, x.shape[-1])
        return self.pad_runs(x)

    def unpad(self, y: Tensor) -> Tensor:
        """(k, W, C) rows -> (capacity, C) tokens, zeros after the last real one."""
        if self.uniform:
            return y.reshape(self.tokens, y.shape[-1])
        return self.unpad_runs(y)

    # Run eagerly inside a compiled block (train.compile; EAGER_IN_COMPILED_BLOCKS): the runs are
    # Python integers that change with every batch's widths, and a traced pad would be recompiled
    # for each layout (8 graphs in 8 steps of a tiny looped Parity run, then torch gives up);
    # outside the graph they cost nothing.
    def pad_runs(self, x: Tensor) -> Tensor:
        C, W = x.shape[-1], self.width
        runs = x.split([rows * w for rows, w in self.runs] + [x.shape[0] - self.tokens])
        parts = [F.pad(run.view(rows, w, C), (0, 0, 0, W - w)) for run, (rows, w) in zip(runs, self.runs)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def unpad_runs(self, y: Tensor) -> Tensor:
        C = y.shape[-1]
        runs = y.split([rows for rows, _ in self.runs])
        parts = [run[:, :w].reshape(rows * w, C) for run, (rows, w) in zip(runs, self.runs)]
        if self.capacity > self.tokens:
            parts.append(y.new_zeros(self.capacity - self.tokens, C))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


class KVCache:
    """The keys and values of the tokens already run, per layer, so that decoding runs one
    new token at a time (lengthgen.model.generate). Keys are stored after `scheme.rotate`, so a
    new query meets them exactly as in a full pass. Only schemes whose `cacheable()` says so can
    use it: those without a bias or content hook (nope, learned, sinusoidal, rope, ...), and a
    content scheme that decodes by its own recurrence (PaTH: its keys change with every new token,
    kept in `state`). ALiBi's bias and TRA's and CoPE's attention are computed over whole windows."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[Tensor, Tensor]] = {}
        self.state: dict[int, dict] = {}  # a scheme's own per-layer decoding state (attend_cached)
        self.length = 0  # tokens cached (the model advances it after each pass)

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append k, v (B, H, T, Dh) to the layer's cache; return all of its keys and values."""
        if layer in self.layers:
            old_k, old_v = self.layers[layer]
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.layers[layer] = (k, v)
        return k, v


# Methods that compiled blocks run eagerly: KVCache.extend's growing length would be a new graph per
# decoded token, and Packed's runs are explained above. compiling.compile_blocks wraps them in
# torch.compiler.disable when it compiles; the decorator here would import torch._dynamo, 2.6 s
# at the start of every process, most of which never compile.
EAGER_IN_COMPILED_BLOCKS = {Packed: ("pad_runs", "unpad_runs"), KVCache: ("extend",)}


def cached_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q (B, H, Tq, Dh), the last Tq of Tk tokens, over k, v (B, H, Tk, Dh), causal."""
    Tq, Tk = q.shape[2], k.shape[2]
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    seen = torch.arange(Tk, device=q.device)[None, :] <= torch.arange(Tk - Tq, Tk, device=q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=seen)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0, "model.n_head must divide model.d_model"
        self.layer = layer  # passed to content schemes, which may hold per-layer parameters
        self.n_head = cfg.n_head
        self.d_model = cfg.d_model
        self.dropout = AttentionDropout(cfg.attn_dropout, cfg.attn_dropout_on)
        self.c_attn = Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias and cfg.qkv_bias)  # q, k, v in one matmul
        self.c_proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)  # residual output projection
        self.resid_drop = nn.Dropout(cfg.dropout)
        # T5's logits are q . k, unscaled (model.attn_scale = false): every path below divides by
        # sqrt(Dh), so q is multiplied by it first, the same logits in every path
        self.q_factor = 1.0 if cfg.attn_scale else (cfg.d_model // cfg.n_head) ** 0.5
        self.recorder: AttentionRecorder | None = None  # installed by `recording`
        self.causal = cfg.causal  # false: bidirectional (an encoder); refused with a cache or content scheme

    def forward(self, x: Tensor, scheme: nn.Module, position_ids: Tensor,
                packed: Packed | None = None, cache: KVCache | None = None) -> Tensor:
        """x (B, T, D), or packed rows (N, D) with their layout `packed`; `scheme` a
        lengthgen.model.positions.PositionalScheme; `cache`: the earlier tokens' keys and values
        (x holds the tokens after them)."""
        qkv = self.c_attn(x)  # (B, T, 3D) or (N, 3D)
        if packed is not None:
            qkv = packed.pad(qkv)  # (B, T, 3D): rows padded for attention only
            x = packed.pad(x) if scheme.has_content else None
        B, T, C = qkv.shape[0], qkv.shape[1], self.d_model
        H, Dh = self.n_head, C // self.n_head
        q, k, v = qkv.split(C, dim=2)  # (B, T, D) each
        q = q.view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
        v = v.view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh)
        q, k = scheme.rotate(q, k, position_ids)
        if self.q_factor != 1.0:
            q = q * self.q_factor
        dropout = self.dropout if self.training else NO_DROPOUT
        if cache is not None:
            y = scheme.attend_cached(q, k, v, x, self.layer, cache)  # (B, H, T, Dh)
        elif scheme.has_content:
            y = self.content_attention(scheme, q, k, v, x, position_ids, dropout)  # (B, H, T, Dh)
        else:
            bias = scheme.bias(position_ids) if scheme.has_bias else None  # (B|1, H, T, T) or None
            if self.recorder is not None:
                self.recorder.add(self.layer, attention_weights(q, k, bias, self.recorder.last_only, self.causal))
            y = dense_attention(q, k, v, bias, dropout, self.causal)  # (B, H, T, Dh)

        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, D): heads side by side
        if packed is not None:
            y = packed.unpad(y)  # (N, D)
        return self.resid_drop(self.c_proj(y))

    def content_attention(self, scheme: nn.Module, q: Tensor, k: Tensor, v: Tensor, x: Tensor,
                          position_ids: Tensor, dropout: AttentionDropout) -> Tensor:
        """A content scheme's attention: its own (`attend`, recording inside it), or the softmax of
        its logits (`content_logits`), plus its bias where it has one."""
        y = scheme.attend(q, k, v, x, self.layer, dropout, self.recorder)
        if y is not None:
            return y  # (B, H, T, Dh), e.g. TRA, CoPE, PaTH
        ids = (position_ids,) if scheme.content_reads_ids else ()  # relative positions read IDs
        logits = scheme.content_logits(q, k, x, self.layer, *ids)  # (B, H, T, T), masked by the scheme
        if scheme.has_bias:
            logits = logits + scheme.bias(position_ids)
        att = dropout.weights(masked_softmax(dropout.logits(logits)))  # (B, H, T, T) float32
        if self.recorder is not None:
            self.recorder.add(self.layer, att)
        return att.to(v.dtype) @ v
