"""Positional schemes behind one interface with four hooks.

A scheme can act in four places (x-transformers separates them the same way):

1. `embed(x, position_ids)`       added to the input embedding   (learned, sinusoidal, coupled IDs)
2. `rotate(q, k, position_ids)`   applied to queries and keys     (RoPE)
3. `bias(position_ids)`           additive attention-logit bias   (ALiBi)
4. `content_logits(q, k, x, layer)` logits computed from content, or
   `attend(q, k, v, x, layer, dropout)` the whole attention     (CoPE, TRA)

The base class does nothing in every hook, which is exactly NoPE. Position IDs
are always passed in explicitly, shape (B, T) or (1, T) (one row broadcast over
the batch), so random offsets, PoSE skips and coupled or predicted IDs need no
model change: a scheme must compute from the IDs it is given, never assume
0..T-1.

Attention reads the class flags `has_bias` / `has_content` to choose its path:
with neither it runs plain causal SDPA (the fast kernels); see attention.py.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lengthgen import register
from lengthgen.config.schema import ModelConfig
from lengthgen.model.attention import AttentionDropout, AttentionRecorder
from lengthgen.model.content_attention import cope_attention, fused, fuses, tra_attention
from lengthgen.model.fope import FoPE
from lengthgen.model.path_attention import PaTH, PaTHFoX
from lengthgen.model.relative_positions import RelativePositions
from lengthgen.model.rotary import RoPE
from lengthgen.model.scheme_base import PositionalScheme, _check_table, default_position_ids  # noqa: F401 (re-exported)
from lengthgen.model.selective_attention import SelectiveAttention
from lengthgen.model.stick_breaking import StickBreaking
from lengthgen.model.xpos import XPos
from lengthgen.tasks.coupled_levels import unpack


class LearnedPositions(PositionalScheme):
    """GPT-2 learned absolute positions: a (max_positions, D) table added to x, drawn from
    N(0, std^2): GPT-2's 0.02 by default; 1.0 is T5's, as Cho et al.'s coupling draws it (a row
    then as large as a token's N(0, 1) embedding under init torch or t5, not 50x smaller).

    `levels` > 1 reads packed multi-level coupled IDs (lengthgen.tasks.coupled_levels): one table
    of max_positions rows per level, their rows summed, as Cho et al.'s `d_positions` tables (2025)."""

    has_table = adds_ids = trains_table = True

    def __init__(self, cfg: ModelConfig, std: float = 0.02, levels: int = 1):
        super().__init__(cfg)
        if isinstance(std, bool) or not isinstance(std, (int, float)) or not 0 < std < 1e3:
            raise ValueError(f"learned: std must be a number in (0, 1000), got {std!r}")
        if isinstance(levels, bool) or not isinstance(levels, int) or not 1 <= levels <= 4:
            raise ValueError(f"learned: levels must be an integer in 1..4, got {levels!r}")
        self.levels = levels
        self.wpe = nn.Embedding(cfg.max_positions, cfg.d_model)
        nn.init.normal_(self.wpe.weight, mean=0.0, std=float(std))  # the scheme owns its init
        if levels > 1:  # the first level keeps the name wpe, so one-level checkpoints load as before
            self.level_tables = nn.ModuleList(nn.Embedding(cfg.max_positions, cfg.d_model) for _ in range(levels - 1))
            for table in self.level_tables:
                nn.init.normal_(table.weight, mean=0.0, std=float(std))

    def embed(self, x: Tensor, position_ids: Tensor) -> Tensor:
        if self.levels == 1:
            _check_table(position_ids, self.max_positions, "learned position")
            return x + self.wpe(position_ids)  # (B|1, T, D) broadcasts over the batch
        for level, table in zip(unpack(position_ids, self.levels), [self.wpe, *self.level_tables]):
            _check_table(level, self.max_positions, "learned position")
            x = x + table(level)
        return x


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """Vaswani et al.: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(same)."""
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]  # (P, 1)
    inv = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))  # (ceil(D/2),)
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)[:, : dim // 2]  # odd D has one fewer cos column
    return table  # (P, D)


class SinusoidalPositions(PositionalScheme):
    """Fixed sinusoidal table added to x (no parameters)."""

    has_table = adds_ids = True

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        # Not persistent: it is a pure function of the config, so checkpoints
        # need not carry it and old checkpoints stay loadable if it changes.
        self.register_buffer("table", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)

    def embed(self, x: Tensor, position_ids: Tensor) -> Tensor:
        _check_table(position_ids, self.max_positions, "sinusoidal position")
        return x + self.table[position_ids].to(x.dtype)  # (B|1, T, D)


def alibi_slopes(n_head: int) -> list[float]:
    """Head slopes exactly as the ALiBi reference code (Press et al., `get_slopes`):
    a geometric sequence starting at 2^(-8/n) for n a power of two; otherwise
    the slopes of the closest smaller power of two, then every other slope of
    twice that many heads."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_head).is_integer():
        return power_of_2(n_head)
    closest = 2 ** math.floor(math.log2(n_head))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n_head - closest]


class ALiBi(PositionalScheme):
    """Linear biases (Press et al.): logit += -slope_h * (pos_i - pos_j). Bidirectional
    (model.causal = false), as Delétang et al.'s and Ruoss et al.'s encoder: -slope_h * |pos_i - pos_j|,
    plus slope_h / 2 where the key is before the query (pos_j < pos_i), which tells left from right
    (their compute_alibi_encodings_biases)."""

    has_bias = True

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(cfg.n_head)), persistent=False)  # (H,)

    def bias(self, position_ids: Tensor) -> Tensor:
        pos = position_ids.float()
        dist = pos[:, :, None] - pos[:, None, :]  # (B|1, T, T): pos_i - pos_j
        if not self.causal:  # both sides: -|d|, half a step less for keys on the left
            dist = dist.abs() - 0.5 * (dist > 0)
        return -self.slopes[None, :, None, None] * dist[:, None]  # (B|1, H, T, T)


class FIRE(PositionalScheme):
    """Functional interpolation for relative positions (Li et al., ICLR 2024): a learned MLP
    f maps the log-transformed distance, normalised by the query's position, to a logit bias
    per head: b(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), with c > 0 and
    the threshold L learned. Positions count from 1 (ID + 1) so the first query's normaliser is
    not 0. One f for every layer, as T5 shares its bias (Cho et al.'s code gives each layer its
    own). `hidden`: f's hidden width; `c`, `threshold`: the initial c and L."""

    has_bias = True
    bidirectional = False  # defined on past keys only

    def __init__(self, cfg: ModelConfig, hidden: int = 32, c: float = 1.0, threshold: float = 1.0):
        super().__init__(cfg)
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"fire hidden must be an integer >= 1, got {hidden!r}")
        for key, value in (("c", c), ("threshold", threshold)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"fire {key} must be a finite number > 0, got {value!r}")
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, cfg.n_head))
        self.log_c = nn.Parameter(torch.tensor(math.log(c)))  # c = exp(log_c) stays > 0
        self.threshold = nn.Parameter(torch.tensor(float(threshold)))

    def psi(self, x: Tensor) -> Tensor:
        return torch.log(self.log_c.exp() * x + 1)

    def bias(self, position_ids: Tensor) -> Tensor:
        pos = position_ids.float() + 1  # (B|1, T)
        distance = (pos[:, :, None] - pos[:, None, :]).clamp(min=0)  # (B|1, T, T): i - j, future keys 0 (masked)
        scale = self.psi(torch.maximum(self.threshold.abs(), pos))[:, :, None]  # (B|1, T, 1)
        return self.mlp((self.psi(distance) / scale)[..., None]).permute(0, 3, 1, 2)  # (B|1, H, T, T)


def t5_bucket(distance: Tensor, buckets: int, max_distance: int) -> Tensor:
    """T5's causal relative-position bucket of distance i - j >= 0 (Raffel et al.; HF
    `_relative_position_bucket` with bidirectional = False): exact below buckets / 2, then
    logarithmic up to max_distance, the last bucket beyond."""
    exact = buckets // 2
    far = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (buckets - exact)).long()
    return torch.where(distance < exact, distance, far.clamp(max=buckets - 1))


class T5Bias(PositionalScheme):
    """T5's relative position bias (Raffel et al., 2020): a learned logit bias per head for each
    bucket of the distance i - j (`t5_bucket`), shared by every layer as in T5. Drawn from
    N(0, d_model^-1/2), as HF's T5 draws it."""

    has_bias = True
    bidirectional = False  # defined on past keys only

    def __init__(self, cfg: ModelConfig, buckets: int = 32, max_distance: int = 128):
        super().__init__(cfg)
        if not isinstance(buckets, int) or isinstance(buckets, bool) or buckets < 2:
            raise ValueError(f"t5 buckets must be an integer >= 2, got {buckets!r}")
        if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance <= buckets // 2:
            raise ValueError(f"t5 max_distance must be an integer > buckets / 2, got {max_distance!r}")
        self.buckets, self.max_distance = buckets, max_distance
        self.table = nn.Embedding(buckets, cfg.n_head)
        nn.init.normal_(self.table.weight, mean=0.0, std=cfg.d_model ** -0.5)

    def bias(self, position_ids: Tensor) -> Tensor:
        distance = (position_ids[:, :, None] - position_ids[:, None, :]).clamp(min=0)  # (B|1, T, T)
        return self.table(t5_bucket(distance, self.buckets, self.max_distance)).permute(0, 3, 1, 2)


class CoPE(PositionalScheme):
    """Contextual position encoding (Golovneva et al., 2024): positions count the keys a
    query's gates let through (`content_attention.cope_attention`). Per layer, learned position
    vectors E (head_dim, npos_max), zero-initialised, shared by the heads.
    `chunk`: queries per pass, so long windows need O(chunk * T) memory (0 = all at once)."""

    has_content = True
    bidirectional = False  # defined on past keys only

    def __init__(self, cfg: ModelConfig, npos_max: int = 64, chunk: int = 512):
        super().__init__(cfg)
        for key, value in (("npos_max", npos_max), ("chunk", chunk)):
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key == "npos_max" else 0):
                raise ValueError(f"cope {key} must be an integer >= {1 if key == 'npos_max' else 0}, got {value!r}")
        self.npos_max, self.chunk = npos_max, chunk
        self.pos_emb = nn.ParameterList(nn.Parameter(torch.zeros(self.head_dim, npos_max))
                                        for _ in range(cfg.n_layer))

    def attend(self, q, k, v, x, layer, dropout, recorder=None):
        kept, last = (recorder.chunks(layer), recorder.last_only) if recorder is not None else (None, False)
        attention = fused("cope") if fuses(q, kept) else cope_attention
        return attention(q, k, v, self.pos_emb[layer], self.chunk, dropout, kept, last)  # pos_emb: (Dh, npos_max)


class FoX(PositionalScheme):
    """The Forgetting Transformer's forget gate (Lin et al., ICLR 2025), instead of any positional
    encoding: each token t writes a per-head forget gate f_t = sigmoid(w . x_t + b) in (0, 1), and
    query i's logit for key j gains D_ij = sum_{l = j+1..i} log f_l <= 0, a decay that grows with
    the distance at the rate the content sets (TRA's gate is its closest relative). Distances
    count tokens in the sequence's order (explicit position IDs are not read). Per layer, the
    gate is Linear(d_model, n_head) with a bias, torch's default init."""

    has_content = True
    bidirectional = False  # defined on past keys only

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.gates = nn.ModuleList(nn.Linear(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))

    def decay(self, x: Tensor, layer: int) -> Tensor:
        """(B, T, D) block input -> (B, H, T, T) D_ij = sum of log f over l = j+1..i (j <= i)."""
        cumulative = F.logsigmoid(self.gates[layer](x).float()).transpose(1, 2).cumsum(-1)  # (B, H, T)
        return cumulative[..., :, None] - cumulative[..., None, :]

    def attend(self, q, k, v, x, layer, dropout, recorder=None):
        """Fused for training on CUDA (content_attention.fused); elsewhere None: the logits path."""
        if not fuses(q, recorder):
            return None
        return fused("fox")(q, k, v, self.gates[layer](x).transpose(1, 2), dropout)

    def content_logits(self, q, k, x, layer):
        T = q.shape[-2]
        logits = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1]) + self.decay(x, layer)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return logits.masked_fill(future, float("-inf"))


class TRA(PositionalScheme):
    """Threshold Relative Attention (Opper et al., TMLR 2025), instead of any positional
    encoding: keys scoring <= 0 are dropped, and distance counts only the kept keys,
    weighted by a per-head forget gate of the query (`content_attention.tra_attention`). Per layer,
    the gate is Linear(d_model, n_head) with a bias, torch's default init.
    `chunk`: queries per pass, so long windows need O(chunk * T) memory (0 = all at once).
    Inside `recording(model)` it hands each layer's attention weights to the recorder."""

    has_content = True
    bidirectional = False  # defined on past keys only

    def __init__(self, cfg: ModelConfig, chunk: int = 512):
        super().__init__(cfg)
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 0:
            raise ValueError(f"tra chunk must be an integer >= 0, got {chunk!r}")
        self.chunk = chunk
        self.gates = nn.ModuleList(nn.Linear(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))

    def attend(self, q, k, v, x, layer, dropout, recorder=None):
        gate_logit = self.gates[layer](x).transpose(1, 2)  # (B, H, T)
        kept, last = (recorder.chunks(layer), recorder.last_only) if recorder is not None else (None, False)
        attention = fused("tra") if fuses(q, kept) else tra_attention
        return attention(q, k, v, gate_logit, self.chunk, dropout, kept, last)


# The built-ins, registered as plugins are (lengthgen.register), in the order listings show them. A
# scheme's own settings are keyword arguments after `cfg` (model.position_options, checked against them).
SCHEMES = register.SCHEMES
SCHEMES.base = PositionalScheme
for _name, _cls in {"nope": PositionalScheme, "learned": LearnedPositions, "sinusoidal": SinusoidalPositions,
                    "rope": RoPE, "alibi": ALiBi, "fire": FIRE, "t5": T5Bias, "cope": CoPE, "fox": FoX, "tra": TRA,
                    "relative": RelativePositions, "xpos": XPos, "stickbreaking": StickBreaking,
                    "selective": SelectiveAttention, "fope": FoPE, "path": PaTH, "path-fox": PaTHFoX}.items():
    SCHEMES.add(_name, _cls)


def build_scheme(cfg: ModelConfig) -> PositionalScheme:
    if cfg.position not in SCHEMES:
        raise ValueError(f"model.position {cfg.position!r} is unknown; choose from {', '.join(SCHEMES)}")
    return SCHEMES[cfg.position](cfg, **cfg.position_options)
