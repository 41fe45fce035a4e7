"""The positional scheme's interface (lengthgen.model.positions describes the four hooks) and the
helpers every scheme shares: the base class is NoPE, the scheme that does nothing. A module of its
own so that schemes kept in other files (lengthgen.model.relative_positions) subclass it without an
import cycle through the registry in positions.py."""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.attention import AttentionDropout, AttentionRecorder, cached_attention


def default_position_ids(seq_len: int, device=None) -> Tensor:
    """0..T-1 as one row, (1, T) long: broadcasts over any batch size, and a
    (1, H, T, T) ALiBi bias costs B times less memory than a (B, H, T, T) one."""
    return torch.arange(seq_len, device=device, dtype=torch.long)[None, :]


_checked_elsewhere = 0  # > 0 inside `ids_checked_elsewhere`


@contextlib.contextmanager
def ids_checked_elsewhere():
    """Inside: table lookups do not read their IDs on the host to check their range, since the
    caller cannot let them (seeds stacked under vmap, lengthgen.accel.stacked) and has made sure
    of the range itself."""
    global _checked_elsewhere
    _checked_elsewhere += 1
    try:
        yield
    finally:
        _checked_elsewhere -= 1


def _check_table(position_ids: Tensor, max_positions: int, name: str) -> None:
    # A table lookup past the end would be an opaque index error (or, for the
    # sinusoidal table, a silent extrapolation the config did not ask for). Not while a CUDA graph
    # records (lengthgen.accel.captured): reading the IDs on the host would break the recording,
    # and the step's first, eager run checked the shape's IDs.
    if _checked_elsewhere or (position_ids.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    hi, lo = int(position_ids.max()), int(position_ids.min())
    if hi >= max_positions or lo < 0:
        raise ValueError(
            f"position id {hi if hi >= max_positions else lo} is outside the {name} table "
            f"[0, {max_positions}); raise model.max_positions (now {max_positions})"
        )


class PositionalScheme(nn.Module):
    """The scheme that does nothing: NoPE. Subclasses override only the hooks they use."""

    has_bias = False  # True if `bias` returns a tensor
    has_content = False  # True if `content_logits` returns a tensor
    has_table = False  # True if it reads a table of model.max_positions rows
    adds_ids = False  # True if `embed` adds the position IDs to the input (absolute positions)
    trains_table = False  # True if its table is a parameter drawn from N(0, std^2), std its `std` option
    # True if it can attend both ways (model.causal = false, checked by lengthgen.assembly.checks): it adds no causal
    # assumption of its own, as a bias or content scheme defined on past keys only (i - j >= 0, a decay
    # along the past) does
    bidirectional = True
    content_reads_ids = False  # True if `content_logits` also takes the position IDs (relative positions)
    # an option sized by the positions trained, which a new run fills with the largest training position
    # ID + 1 where its config leaves it unset (lengthgen.assembly.runs._training_window_option; FoPE's window)
    window_option: str | None = None

    @classmethod
    def cacheable(cls) -> bool:
        """Whether decoding with a KV cache works (`attend_cached`): schemes with a bias or their own
        attention do not, unless they override this and `attend_cached`."""
        return not (cls.has_bias or cls.has_content)

    @classmethod
    def check(cls, model: ModelConfig) -> None:
        """ValueError (naming the key) if the block cannot use this scheme; schemes add their own."""
        if cls.has_content and not model.attn_scale:
            raise ValueError(f"model.attn_scale = false drops the 1/sqrt(head width) of dot-product logits; "
                             f"model.position {model.position} computes its own attention (set model.attn_scale = true)")

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d_model = cfg.d_model
        self.n_head = cfg.n_head
        self.n_layer = cfg.n_layer  # so content schemes can hold per-layer parameters
        self.head_dim = cfg.d_model // cfg.n_head
        self.max_positions = cfg.max_positions
        self.causal = cfg.causal  # a bias or content scheme masks (or not) the future itself

    def embed(self, x: Tensor, position_ids: Tensor) -> Tensor:
        """x (B, T, D), position_ids (B|1, T) long -> (B, T, D)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """q, k (B, H, T, Dh) -> rotated q, k, same shapes."""
        return q, k

    def bias(self, position_ids: Tensor) -> Tensor | None:
        """Additive logit bias broadcastable to (B, H, T, T), or None. Attention
        adds the causal mask itself, so the bias need not mask the future."""
        return None

    def content_logits(self, q: Tensor, k: Tensor, x: Tensor, layer: int) -> Tensor | None:
        """Full attention logits (B, H, T, T) from q, k (B, H, T, Dh, after `rotate`)
        and the block input x (B, T, D), or None. The scheme owns the scaling
        and all masking: future keys and any key it drops must be -inf. A row
        with every key -inf gives a zero output (not NaN). `layer` is the block
        index, for schemes with per-layer parameters."""
        return None

    def attend(self, q: Tensor, k: Tensor, v: Tensor, x: Tensor, layer: int,
               dropout: AttentionDropout, recorder: AttentionRecorder | None = None) -> Tensor | None:
        """The attention output (B, H, T, Dh) computed by the scheme itself (a content
        scheme that needs more than logits: chunked queries, its own masking), or None to
        let attention softmax `content_logits`. `dropout` acts on the logits or the weights."""
        return None

    def attend_cached(self, q: Tensor, k: Tensor, v: Tensor, x: Tensor, layer: int, cache) -> Tensor:
        """Attention of the new tokens' q (B, H, Tq, Dh) over the cached keys and values and their own
        (`cache` a lengthgen.model.attention.KVCache, which takes k, v); x (B, Tq, D) their block input."""
        return cached_attention(q, *cache.extend(layer, k, v))
