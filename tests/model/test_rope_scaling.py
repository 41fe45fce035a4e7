"""RoPE stretched at test time: each formula against its definition worked by hand, against
Hugging Face transformers' reference code, and the stretch of a model's RoPE modules, which
leaves them as trained afterwards."""
from __future__ import annotations

import math

import pytest
import torch

from lengthgen.config.schema import ModelConfig
from lengthgen.model import rope_scaling as rs
from lengthgen.model.rotary import RoPE, stretched_rope
from lengthgen.model.transformer import Transformer

THETA, DH = 10000.0, 16


def rope(theta: float = THETA) -> RoPE:
    return RoPE(ModelConfig(d_model=2 * DH, n_head=2, position="rope"), theta=theta)


def test_position_interpolation_reads_position_p_times_s_as_training_read_p():
    module, s = rope(), 4.0
    p = torch.arange(0, 40)[None]
    before = module.cos_sin(p)
    with stretched_rope(module, "pi", s, 10):
        after = module.cos_sin(p * 4)
    for a, b in zip(before, after):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=0)
    inv_freq, gain = rs.position_interpolation(THETA, DH, s, 10)
    assert gain == 1.0 and torch.equal(inv_freq, rs.rope_inv_freq(THETA, DH) / s)


def test_ntk_divides_the_lowest_frequency_by_exactly_s_and_keeps_the_highest():
    s = 8.0
    trained = rs.rope_inv_freq(THETA, DH)
    inv_freq, gain = rs.ntk_aware(THETA, DH, s, 10)
    assert gain == 1.0
    assert inv_freq[0] == trained[0] == 1.0  # pair 0 turns one radian per position whatever the base
    assert inv_freq[-1].item() == pytest.approx(trained[-1].item() / s, rel=1e-6)
    # in between: theta^(-2i/Dh) * s^(-2i/(Dh-2)), i.e. the base times s^(Dh/(Dh-2))
    i = torch.arange(DH // 2, dtype=torch.float64)
    by_hand = THETA ** (-2 * i / DH) * s ** (-2 * i / (DH - 2))
    torch.testing.assert_close(inv_freq.double(), by_hand, rtol=1e-6, atol=0)


def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between():
    # Dh 16, theta 1e4, L 2048: 32 rotations fall at pair 2.02 (floored to 2), 1 rotation at 5.03
    # (ceiled to 6): pairs 0-2 kept, 6-7 interpolated, 3, 4, 5 a quarter, half, three quarters
    s, length = 4.0, 2048
    assert rs.yarn_ramp_ends(THETA, DH, length) == (2, 6)
    trained = rs.rope_inv_freq(THETA, DH).double()
    inv_freq, gain = rs.yarn(THETA, DH, s, length)
    ramp = torch.tensor([0, 0, 0, 0.25, 0.5, 0.75, 1, 1], dtype=torch.float64)
    torch.testing.assert_close(inv_freq.double(), trained * (1 - ramp) + trained / s * ramp, rtol=1e-6, atol=0)
    assert gain == pytest.approx(0.1 * math.log(4.0) + 1)
    # the definition by rotations over the training length: r > beta_fast kept, r < beta_slow interpolated
    rotations = length * trained / (2 * math.pi)
    assert torch.equal(inv_freq[rotations > 32].double(), trained[rotations > 32])
    torch.testing.assert_close(inv_freq[rotations < 1].double(), trained[rotations < 1] / s, rtol=1e-6, atol=0)


def test_yarns_temperature_scales_cos_and_sin_so_each_logit_by_its_square():
    module, s = rope(), 16.0
    p = torch.arange(0, 50)[None]
    with stretched_rope(module, "yarn", s, 64):
        cos, sin = module.cos_sin(p)
    mscale = 0.1 * math.log(s) + 1
    torch.testing.assert_close(cos ** 2 + sin ** 2, torch.full_like(cos, mscale ** 2), atol=1e-5, rtol=0)
    assert rs.yarn_attention_factor(1.0) == 1.0


@pytest.mark.parametrize("scaling", rs.SCALINGS)
def test_none_and_a_factor_of_one_are_rope_as_trained_bit_for_bit(scaling):
    module = rope()
    p = torch.arange(0, 30)[None]
    before = module.cos_sin(p)
    with stretched_rope(module, scaling, 1.0, 30):
        during = module.cos_sin(p)
    assert all(torch.equal(a, b) for a, b in zip(before, during))


def test_the_stretch_is_undone_after_the_context_even_on_an_error():
    model = Transformer(ModelConfig(d_model=32, n_head=2, n_layer=1, position="rope"), vocab_size=8)
    module = model.scheme
    with pytest.raises(RuntimeError, match="boom"):
        with stretched_rope(model, "yarn", 4.0, 16):
            assert module.stretch is not None
            raise RuntimeError("boom")
    assert module.stretch is None
    ids = torch.randint(0, 8, (2, 12))
    with torch.no_grad():
        plain = model(ids)
        with stretched_rope(model, "pi", 4.0, 3):
            stretched = model(ids)
        again = model(ids)
    assert not torch.equal(plain, stretched) and torch.equal(plain, again)


def test_a_model_without_rope_is_refused_and_none_is_always_fine():
    model = Transformer(ModelConfig(d_model=32, n_head=2, n_layer=1, position="alibi"), vocab_size=8)
    with pytest.raises(ValueError, match="has no RoPE"):
        with stretched_rope(model, "ntk", 2.0, 8):
            pass
    with stretched_rope(model, "none", 2.0, 8):
        pass
    with pytest.raises(ValueError, match="none, pi, ntk, yarn"):
        rs.stretched("rescale", THETA, DH, 2.0, 8)


# -- against Hugging Face transformers (transformers.modeling_rope_utils) ----------------------

CASES = [(10000.0, 16, 12, 4.0), (500000.0, 32, 128, 32.0), (10000.0, 8, 40, 2.5), (10000.0, 64, 2048, 8.0)]


def hf_config(theta, dh, length, **rope_parameters):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(hidden_size=2 * dh, num_attention_heads=2, head_dim=dh,
                                    max_position_embeddings=length,
                                    rope_parameters={"rope_theta": theta, **rope_parameters})


@pytest.mark.parametrize("theta, dh, length, s", CASES)
@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_matches_transformers(theta, dh, length, s, truncate):
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    cfg = hf_config(theta, dh, length, rope_type="yarn", factor=s, original_max_position_embeddings=length,
                    truncate=truncate)
    theirs, their_gain = _compute_yarn_parameters(cfg)
    ours, our_gain = rs.yarn(theta, dh, s, length, truncate=truncate)
    assert our_gain == their_gain
    torch.testing.assert_close(ours, theirs, rtol=3e-7, atol=0)  # float32 rounding of 1/(s b^x) vs b^-x / s


@pytest.mark.parametrize("theta, dh, length, s", CASES)
def test_position_interpolation_matches_transformers_linear(theta, dh, length, s):
    from transformers.modeling_rope_utils import _compute_linear_scaling_rope_parameters

    theirs, gain = _compute_linear_scaling_rope_parameters(hf_config(theta, dh, length, rope_type="linear", factor=s))
    assert gain == 1.0
    torch.testing.assert_close(rs.position_interpolation(theta, dh, s, length)[0], theirs, rtol=3e-7, atol=0)


@pytest.mark.parametrize("theta, dh, length, s", CASES)
def test_ntk_matches_transformers_dynamic_at_the_same_ratio(theta, dh, length, s):
    # transformers' "dynamic" NTK stretches the base by (factor * seq_len / L - (factor - 1))^(Dh/(Dh-2)):
    # with its factor 1 that is (seq_len / L)^(Dh/(Dh-2)), our s = seq_len / L
    from transformers.modeling_rope_utils import _compute_dynamic_ntk_parameters

    cfg = hf_config(theta, dh, length, rope_type="dynamic", factor=1.0)
    theirs, gain = _compute_dynamic_ntk_parameters(cfg, seq_len=int(s * length))
    assert gain == 1.0 and int(s * length) / length == s
    torch.testing.assert_close(rs.ntk_aware(theta, dh, s, length)[0], theirs, rtol=3e-6, atol=0)


def test_xpos_is_rotary_its_rotation_stretches_and_its_decay_stays():
    model = Transformer(ModelConfig(d_model=32, n_head=2, n_layer=1, position="xpos"), vocab_size=8)
    ids = torch.randint(0, 8, (2, 12))
    p = torch.arange(12)[None]
    decay = model.scheme.scales(p)
    with torch.no_grad():
        plain = model(ids)
        with stretched_rope(model, "pi", 4.0, 3):
            stretched = model(ids)
            assert torch.equal(model.scheme.scales(p), decay)
    assert not torch.equal(plain, stretched)
