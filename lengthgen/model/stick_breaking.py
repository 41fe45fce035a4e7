"""Stick-breaking attention (Tan et al., "Scaling Stick-Breaking Attention", ICLR 2025): a
content scheme with no positional encoding at all, whose order comes from the attention itself."""
from __future__ import annotations

from lengthgen.model.content_attention import fused, fuses, stick_breaking_attention
from lengthgen.model.scheme_base import PositionalScheme


class StickBreaking(PositionalScheme):
    """Stick-breaking attention instead of softmax and of any positional encoding: each earlier
    key j, nearest first, takes the share sigmoid(q_i . k_j / sqrt(Dh)) of what is left of query
    i's stick, so A_ij = beta_ij * prod_{j<m<i} (1 - beta_im) and a near key can shadow every
    key behind it (`content_attention.stick_breaking_attention`). As in the reference
    (attend_current = False), the query's own key breaks no stick and the remainder goes to its
    own value. Distances count tokens in the sequence's order (explicit position IDs are not
    read). No parameters of its own.
    `chunk`: queries per pass, so long windows need O(chunk * T) memory (0 = all at once).
    Inside `recording(model)` it hands each layer's attention weights to the recorder."""

    has_content = True
    bidirectional = False  # the stick is broken along the past, nearest key first

    def __init__(self, cfg, chunk: int = 512):
        super().__init__(cfg)
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0:
            raise ValueError(f"stickbreaking chunk must be an integer >= 0, got {chunk!r}")
        self.chunk = chunk

    def attend(self, q, k, v, x, layer, dropout, recorder=None):
        kept, last = (recorder.chunks(layer), recorder.last_only) if recorder is not None else (None, False)
        attention = fused("stickbreaking") if fuses(q, kept) else stick_breaking_attention
        return attention(q, k, v, self.chunk, dropout, kept, last)
