"""Cho et al.'s T5 block as config (model.residual = "pre-and-post-norm", model.mlp = "gated-gelu",
model.attn_scale, model.init = "t5", model.scaled_head), each against a computation written by
hand from the definitions in their custom T5 (HanseulJo/position-coupling,
src/model/modeling/custom_t5_decoder_only.py) and HF's T5DenseGatedActDense."""
import math

import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import ModelConfig
from lengthgen.errors import ConfigError
from lengthgen.model.positions import LearnedPositions, PositionalScheme, default_position_ids
from lengthgen.model.transformer import Block, Transformer
from test_blocks import randomise

D, H = 16, 2
pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**kw) -> ModelConfig:
    return ModelConfig(**{"d_model": D, "n_layer": 1, "n_head": H, "mlp_ratio": 2, "norm": "rmsnorm",
                          "bias": False, **kw})


def rms(norm, h):  # Cho et al.'s RMSNorm up to its eps: scale * x / rms(x)
    return norm.weight * h / h.pow(2).mean(-1, keepdim=True).sqrt()


def gelu_new(t):  # GPT-2's and T5's gelu_new: the tanh approximation, written out
    return 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))


def gated_gelu(mlp, h):
    """T5DenseGatedActDense: wo(gelu_new(wi_0 h) * wi_1 h); wi_0 is lengthgen's gate, wi_1 its fc."""
    return (gelu_new(h @ mlp.c_gate.weight.T) * (h @ mlp.c_fc.weight.T)) @ mlp.c_proj.weight.T


def attention(attn, h, scaled=True):
    B, T, _ = h.shape
    q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in (h @ attn.c_attn.weight.T).split(D, -1))
    scores = q @ k.transpose(-2, -1) / (math.sqrt(D // H) if scaled else 1.0)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D) @ attn.c_proj.weight.T


@torch.no_grad()
def test_gated_gelu_equals_its_hand_computation():
    block = randomise(Block(cfg(mlp="gated-gelu"), 0))
    h = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(block.mlp(h), gated_gelu(block.mlp, h), atol=1e-4, rtol=1e-5)
    assert block.mlp.c_fc.weight.shape == block.mlp.c_gate.weight.shape == (2 * D, D)  # d_ff = mlp_ratio * d_model


@pytest.mark.parametrize("scaled", [True, False])
@torch.no_grad()
def test_pre_and_post_norm_norms_before_each_sublayer_and_after_its_add(scaled):
    """Cho et al.'s layer_norm_position "pre_post": h = ln'(h + f(ln(h))), for attention, then the MLP."""
    c = cfg(residual="pre-and-post-norm", mlp="gated-gelu", attn_scale=scaled)
    block = randomise(Block(c, 0))
    h = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(0)) * 3
    h1 = rms(block.ln_1_post, h + attention(block.attn, rms(block.ln_1, h), scaled))
    want = rms(block.ln_2_post, h1 + gated_gelu(block.mlp, rms(block.ln_2, h1)))
    got = block(h, PositionalScheme(c), default_position_ids(6))
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert len([m for m in block.modules() if isinstance(m, torch.nn.RMSNorm)]) == 4


def test_other_blocks_keep_their_parameters():
    """The post norms exist in the pre-and-post block only: saved pre-norm runs load as before."""
    names = set(dict(Block(cfg(), 0).named_parameters()))
    both = set(dict(Block(cfg(residual="pre-and-post-norm"), 0).named_parameters()))
    assert both - names == {"ln_1_post.weight", "ln_2_post.weight"}


@torch.no_grad()
def test_t5_init_draws_each_matrix_from_its_fan_in():
    """HF T5 _init_weights with factor 1: q N(0, (d_model d_kv)^-1/2), k, v N(0, d_model^-1/2),
    o N(0, (H d_kv)^-1/2), wi N(0, d_model^-1/2), wo N(0, d_ff^-1/2); embeddings N(0, 1)."""
    d, h = 256, 4
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=d, n_head=h, n_layer=1, mlp_ratio=2, init="t5", bias=False,
                                    mlp="gated-gelu", position="learned", max_positions=64), 15,
                        scheme=None)
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    q, k, v = attn.c_attn.weight.split(d)
    want = {"q": (q, (d * d // h) ** -0.5), "k": (k, d ** -0.5), "v": (v, d ** -0.5), "o": (attn.c_proj.weight, d ** -0.5),
            "wi_0": (mlp.c_gate.weight, d ** -0.5), "wi_1": (mlp.c_fc.weight, d ** -0.5),
            "wo": (mlp.c_proj.weight, (2 * d) ** -0.5), "tokens": (model.wte.weight, 1.0)}
    for name, (weight, std) in want.items():
        assert abs(weight.std().item() / std - 1) < 0.05 and abs(weight.mean().item()) < 0.05 * std, name
    assert model.lm_head.weight is model.wte.weight  # tied by default, as T5's tie_word_embeddings
    assert abs(model.scheme.wpe.weight.std().item() - 0.02) < 0.002  # the scheme keeps its own init
    table = LearnedPositions(ModelConfig(d_model=d, max_positions=64), std=1.0).wpe.weight
    assert abs(table.std().item() - 1.0) < 0.05  # position_options.std = 1.0: T5's N(0, 1) table


@torch.no_grad()
def test_unscaled_attention_with_t5_init_equals_scaled_attention_at_init():
    """Mesh TensorFlow moves the 1/sqrt(d_kv) into q's init: the two parametrisations start equal."""
    c = cfg(init="t5", attn_scale=False)
    torch.manual_seed(3)
    t5 = Transformer(c, 11)
    plain = Transformer(cfg(init="t5"), 11)
    plain.load_state_dict(t5.state_dict())
    with torch.no_grad():
        plain.blocks[0].attn.c_attn.weight[:D] *= math.sqrt(D // H)
    tokens = torch.randint(0, 11, (2, 7), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(t5(tokens), plain(tokens), atol=1e-5)


@torch.no_grad()
def test_scaled_head_multiplies_the_normed_state_by_rsqrt_d_before_the_tied_read_out():
    model = randomise(Transformer(cfg(scaled_head=True), 11))
    h = torch.randn(2, 4, D, generator=torch.Generator().manual_seed(2))
    want = rms(model.ln_f, h) * D ** -0.5 @ model.wte.weight.T
    assert torch.allclose(model.head(h), want, atol=1e-5)


@pytest.mark.parametrize("override, words", [
    ("model.residual=pre-post", ["model.residual", "pre-and-post-norm"]),
    ("model.mlp=gated-gelu2", ["model.mlp", "did you mean gated-gelu"]),
    ("model.init=t6", ["model.init", "did you mean t5"]),
    ("model.attn_scale=0", ["model.attn_scale", "bool"]),
    ("model.scaled_head=1", ["model.scaled_head", "bool"]),
    ("model.position_options.std=-1", ["model.position_options", "std"]),
])
def test_bad_block_options_are_one_line_errors_naming_the_key(override, words):
    sets = ["model.position=learned"] if "std" in override else []
    with pytest.raises(ConfigError) as err:
        new_run_config(None, sets + [override])
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_unscaled_attention_is_refused_for_schemes_with_their_own_logits():
    with pytest.raises(ConfigError, match="model.attn_scale"):
        new_run_config(None, ["model.attn_scale=false", "model.position=tra"])
