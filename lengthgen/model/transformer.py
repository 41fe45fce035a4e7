"""GPT-2 style transformer, nanoGPT-sized, with the block variants as config.

Block variants (model.*): `norm` layernorm | rmsnorm; `mlp` gelu | gelu-tanh
| relu | swiglu | gated-gelu (hidden width mlp_ratio * d_model, for both the linear
and the gate units of the gated ones); `bias` in the blocks' linear layers
(`qkv_bias` false keeps q, k, v bias-free); `residual` pre-norm (x + f(norm(x)),
GPT-2) | norm-before-add (x = norm(x); x + f(x), the TRA notebook's block) |
post-norm (x = norm(x + f(x)), Vaswani et al.'s) | pre-and-post-norm (x = norm'(x + f(norm(x))), Cho et al.'s T5 block);
`attn_scale` false drops the 1/sqrt(head width) of the logits (T5); `dropout` on
the residual stream (embedding included), `embed_dropout` on the embedding
alone, `attn_dropout` on the attention weights or logits (`attn_dropout_on`)
and `mlp_dropout` on the MLP's hidden units; `scaled_head` multiplies the final
hidden state by d_model^-1/2 before the read-out (T5's tied read-out); `causal`
false makes attention bidirectional (an encoder). The defaults are GPT-2's block.

The forward pass is split into `embed`, `run_blocks` and `head` because the
looped model reuses them: it embeds once, applies the blocks T times with
input injection (h_t = run_blocks(h_{t-1} + e)) and may read out after any
iteration with `head`.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.attention import CausalSelfAttention, KVCache, Packed
from lengthgen.model.linear import Linear
from lengthgen.model.positions import PositionalScheme, build_scheme, default_position_ids
from lengthgen.tasks.base import PAD


# model.norm -> the norm, over the last dimension: LayerNorm (weight and bias) or RMSNorm
# (x / sqrt(mean(x^2) + eps) * weight, eps the dtype's machine epsilon)
NORMS = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm}


def make_norm(cfg: ModelConfig) -> nn.Module:
    return NORMS[cfg.norm](cfg.d_model)


class MLP(nn.Module):
    """GPT-2: c_proj(gelu(c_fc(x))); gelu-tanh is GPT-2's own `gelu_new`, the tanh approximation."""

    matrices = 2  # d x hidden matrices (lengthgen.runtime.resources counts them)

    def __init__(self, cfg: ModelConfig, act: nn.Module):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.c_fc = Linear(cfg.d_model, hidden, bias=cfg.bias)
        self.gelu = act
        self.c_proj = Linear(hidden, cfg.d_model, bias=cfg.bias)  # residual output projection
        self.hidden_drop = nn.Dropout(cfg.mlp_dropout)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.c_proj(self.hidden_drop(self.gelu(self.c_fc(x)))))  # (B, T, D)


class GatedMLP(nn.Module):
    """c_proj(act(c_gate(x)) * c_fc(x)), hidden width mlp_ratio * d_model. swiglu (Shazeer 2020):
    act = silu; gated-gelu (T5's, as Cho et al. use it): act = gelu_new, the tanh approximation."""

    matrices = 3

    def __init__(self, cfg: ModelConfig, act: nn.Module):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.d_model
        self.c_fc = Linear(cfg.d_model, hidden, bias=cfg.bias)  # linear units
        self.c_gate = Linear(cfg.d_model, hidden, bias=cfg.bias)  # gate units
        self.c_proj = Linear(hidden, cfg.d_model, bias=cfg.bias)  # residual output projection
        self.act = act
        self.hidden_drop = nn.Dropout(cfg.mlp_dropout)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.c_proj(self.hidden_drop(self.act(self.c_gate(x)) * self.c_fc(x))))  # (B, T, D)


# model.mlp -> (the MLP, its activation)
MLPS = {"gelu": (MLP, lambda: nn.GELU()), "gelu-tanh": (MLP, lambda: nn.GELU(approximate="tanh")),
        "relu": (MLP, nn.ReLU), "swiglu": (GatedMLP, nn.SiLU), "gated-gelu": (GatedMLP, lambda: nn.GELU(approximate="tanh"))}


def make_mlp(cfg: ModelConfig) -> nn.Module:
    kind, act = MLPS[cfg.mlp]
    return kind(cfg, act())


def pre_norm(block: "Block", x: Tensor, attend) -> Tensor:
    x = x + attend(block.ln_1(x))
    return x + block.mlp(block.ln_2(x))


def norm_before_add(block: "Block", x: Tensor, attend) -> Tensor:
    x = block.ln_1(x)
    x = x + attend(x)
    x = block.ln_2(x)
    return x + block.mlp(x)


def post_norm(block: "Block", x: Tensor, attend) -> Tensor:
    x = block.ln_1(x + attend(x))
    return block.ln_2(x + block.mlp(x))


def pre_and_post_norm(block: "Block", x: Tensor, attend) -> Tensor:
    x = block.ln_1_post(x + attend(block.ln_1(x)))
    return block.ln_2_post(x + block.mlp(block.ln_2(x)))


# model.residual -> how a block adds its sublayers to the residual stream
RESIDUALS = {"pre-norm": pre_norm, "norm-before-add": norm_before_add, "post-norm": post_norm,
             "pre-and-post-norm": pre_and_post_norm}


class Block(nn.Module):
    """pre-norm: x = x + attn(ln1(x)); x = x + mlp(ln2(x)).
    norm-before-add: x = ln1(x); x = x + attn(x); x = ln2(x); x = x + mlp(x).
    post-norm: x = ln1(x + attn(x)); x = ln2(x + mlp(x)) (Vaswani et al.'s, Delétang et al.'s encoder).
    pre-and-post-norm: x = ln1_post(x + attn(ln1(x))); x = ln2_post(x + mlp(ln2(x))), the
    residual stream itself normed after each add (Cho et al.'s T5 layers, layer_norm_position
    "pre_post"); the post norms exist only in this block, so other blocks' weights are unchanged."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.residual = RESIDUALS[cfg.residual]
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln_2 = make_norm(cfg)
        self.mlp = make_mlp(cfg)
        if self.residual is pre_and_post_norm:  # the post norms exist only in this block
            self.ln_1_post, self.ln_2_post = make_norm(cfg), make_norm(cfg)

    def forward(self, x: Tensor, scheme: PositionalScheme, position_ids: Tensor,
                packed: Packed | None = None, cache: KVCache | None = None) -> Tensor:
        return self.residual(self, x, lambda h: self.attn(h, scheme, position_ids, packed, cache))


class Transformer(nn.Module):
    """Token embedding + positional scheme + blocks + ln_f + lm_head (tied by default).

    `scheme` overrides the one named by cfg.position (tests and experiments
    with schemes not in the registry); it is shared by every block, so
    per-layer parameters live in the scheme, indexed by `layer`.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, scheme: PositionalScheme | None = None):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, cfg.d_model)
        # a linear read-in of one-hot tokens is an embedding table plus one bias vector
        self.wte_bias = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.embed_bias else None
        self.drop = nn.Dropout(cfg.embed_dropout or cfg.dropout)  # validation allows one of the two
        self.scheme = scheme if scheme is not None else build_scheme(cfg)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        self.lm_head = Linear(cfg.d_model, vocab_size, bias=cfg.head_bias)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight  # one (V, D) matrix reads in and out
        INITS[cfg.init](self)
        # init "torch" keeps torch's module defaults: kaiming-uniform linears and a
        # N(0, 1) embedding. The looped CPU presets use it: the looped state is
        # LayerNorm-ed every iteration (entries ~1), and GPT-2's 0.02 embedding
        # makes the injected input ~50x smaller than that state; on Parity the
        # looped block then learns a shortcut that does not extrapolate (docs/looped.md).

    def _init_gpt2(self) -> None:
        # GPT-2 init everywhere except inside the scheme, which owns its own
        # init (CoPE's position vectors start at zero, TRA's gate has a bias).
        for name, module in self.named_modules():
            if not name.startswith("scheme"):
                self._init_weights(module)
        # Residual projections scaled by 1/sqrt(2 * n_layer) (two per block) so
        # the residual stream's variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.cfg.n_layer))

    def _init_looped_tf(self) -> None:
        """The looped-tf release (src/models.py): GPT-2's init inside the blocks; the read-in
        and read-out keep torch's defaults. With `embed_bias` the read-in is nn.Linear(V, D)
        on one-hot tokens, whose weight and bias are uniform in +-1/sqrt(V); without, an
        nn.Embedding, N(0, 1). The read-out is nn.Linear(D, V), as built."""
        for name, module in self.blocks.named_modules():
            self._init_weights(module)
        for name, p in self.blocks.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.cfg.n_layer))
        if self.wte_bias is not None:
            bound = 1 / math.sqrt(self.vocab_size)
            nn.init.uniform_(self.wte.weight, -bound, bound)
            nn.init.uniform_(self.wte_bias, -bound, bound)

    def _init_tra(self) -> None:
        """The TRA authors' notebook: the blocks keep torch's defaults; the embedding is uniform
        in +-0.01 with the PAD row zero (at init: PAD is only padding after a sequence's end),
        the read-out normal(0, 0.02) with a zero bias."""
        nn.init.uniform_(self.wte.weight, -0.01, 0.01)
        with torch.no_grad():
            self.wte.weight[PAD].zero_()
        if self.lm_head.weight is not self.wte.weight:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=0.02)
        if self.lm_head.bias is not None:
            nn.init.zeros_(self.lm_head.bias)

    def _init_t5(self) -> None:
        """Mesh TensorFlow's init, as Cho et al.'s custom T5 (HF T5PreTrainedModel._init_weights):
        the token table (the read-out when tied) N(0, 1); each linear layer N(0, fan_in^-1/2), the
        query rows also divided by sqrt(head width), which stands in for the 1/sqrt(head width)
        that T5's logits lack (model.attn_scale = false); an untied read-out N(0, 1), as T5's;
        biases 0, norm weights 1. The scheme keeps its own init (a learned table: its `std`
        option, 1.0 for T5's N(0, 1))."""
        heads_width = self.cfg.d_model // self.cfg.n_head
        for name, module in self.named_modules():
            if name.startswith("scheme"):
                continue
            if isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=1.0)
            elif isinstance(module, nn.Linear) and module is not self.lm_head:
                nn.init.normal_(module.weight, mean=0.0, std=module.in_features ** -0.5)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:
            with torch.no_grad():
                block.attn.c_attn.weight[:self.cfg.d_model].mul_(heads_width ** -0.5)  # q's rows
        if self.lm_head.weight is not self.wte.weight:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=1.0)
        if self.lm_head.bias is not None:
            nn.init.zeros_(self.lm_head.bias)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def position_ids_for(self, inputs: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """The given IDs checked against inputs (B, T), or 0..T-1 as (1, T)."""
        B, T = inputs.shape
        if position_ids is None:
            return default_position_ids(T, inputs.device)
        if position_ids.dim() != 2 or position_ids.shape[1] != T or position_ids.shape[0] not in (1, B):
            raise ValueError(f"position_ids must be (B, T) or (1, T) for inputs {tuple(inputs.shape)}, "
                             f"got {tuple(position_ids.shape)}")
        return position_ids.long()

    def embed(self, inputs: Tensor, position_ids: Tensor) -> Tensor:
        """inputs (B, T) long -> e (B, T, D): tokens plus the scheme's embedding."""
        tokens = self.wte(inputs) if self.wte_bias is None else self.wte(inputs) + self.wte_bias
        return self.drop(self.scheme.embed(tokens, position_ids))

    def run_blocks(self, h: Tensor, position_ids: Tensor, packed: Packed | None = None,
                   cache: KVCache | None = None) -> Tensor:
        """Every block once: (B, T, D) -> (B, T, D), or packed rows (N, D) -> (N, D). With a
        `cache`, h holds the tokens after the cached ones, and the cache takes their keys."""
        if cache is not None:
            if not self.cfg.causal:
                raise ValueError("decoding with a KV cache needs causal attention (model.causal = true)")
            if not self.scheme.cacheable():
                raise ValueError(f"decoding with a KV cache needs a scheme without a bias or content hook "
                                 f"(nope, learned, sinusoidal, rope) or one that decodes by itself (path), "
                                 f"not {self.cfg.position}")
            if packed is not None:
                raise ValueError("a KV cache takes (B, T, D) rows, not packed ones")
        for block in self.blocks:
            h = block(h, self.scheme, position_ids, packed, cache)
        if cache is not None:
            cache.length += h.shape[1]
        return h

    def head(self, h: Tensor) -> Tensor:
        """(B, T, D) -> logits (B, T, V)."""
        return self.read_out(self.ln_f(h))

    def read_out(self, h: Tensor) -> Tensor:
        """Normed states (B, T, D) -> logits (B, T, V): lm_head, after T5's d_model^-1/2 with
        scaled_head (its tied N(0, 1) read-out would give logits of size ~sqrt(D) on normed states)."""
        return self.lm_head(h * self.cfg.d_model ** -0.5 if self.cfg.scaled_head else h)

    def forward(self, inputs: Tensor, position_ids: Tensor | None = None) -> Tensor:
        position_ids = self.position_ids_for(inputs, position_ids)
        return self.head(self.run_blocks(self.embed(inputs, position_ids), position_ids))

    def num_params(self, non_embedding: bool = False) -> int:
        """Unique parameters (the tied embedding counts once). non_embedding
        drops the tables that are only looked up (a learned position table; the
        token table when untied), the convention for FLOP estimates; a tied
        token table stays because it is also the lm_head matmul."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= sum(m.weight.numel() for m in self.scheme.modules() if isinstance(m, nn.Embedding))
            if self.lm_head.weight is not self.wte.weight:
                n -= self.wte.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> int:
        """Forward + backward FLOPs per token (PaLM appendix B, as nanoGPT):
        6 N for the weight matmuls plus 12 L D T for attention scores and
        values at context T (counted over the full T x T square, as PaLM does).
        One pass through the blocks: a looped model multiplies the block part."""
        L, D = self.cfg.n_layer, self.cfg.d_model
        return 6 * self.num_params(non_embedding=True) + 12 * L * D * seq_len


# model.init -> what it does to a freshly built Transformer ("torch": keep torch's defaults)
INITS = {"gpt2": Transformer._init_gpt2, "torch": lambda model: None, "looped-tf": Transformer._init_looped_tf,
         "tra": Transformer._init_tra, "t5": Transformer._init_t5}
