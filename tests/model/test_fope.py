"""FoPE (Hua et al., 2025), checked against its definition (each rotary pair a Fourier series over the
frequencies above the clipping floor 2 pi / window, the rest unrotated) and against vLLM's
FourierRotaryEmbedding formula, transcribed below, on the same inputs and coefficients."""
import math

import pytest
import torch

from lengthgen.config.schema import ModelConfig
from lengthgen.model.fope import FoPE, kept_frequencies
from lengthgen.model.positions import build_scheme
from lengthgen.model.rotary import RoPE
from lengthgen.model.transformer import Transformer
from fitting import trains_with_finite_gradients

pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**kw) -> ModelConfig:
    base = dict(d_model=64, n_layer=1, n_head=4, max_positions=64, position="fope")
    base.update(kw)
    return ModelConfig(**base)


def vllm_rotate(q, k, positions, inv_freq, cos_coef, sin_coef, head_size):
    """vLLM's FourierRotaryEmbedding (_compute_cos_sin_cache with fope_sep_head, then forward_native),
    transcribed for (T, heads, head_size) q and k: the series per head from the kept frequencies,
    padded with cos 1 and sin 0, doubled for the NeoX halves, q cos + rotate_neox(q) sin."""
    t = torch.arange(int(positions.max()) + 1, dtype=torch.float)
    freqs = torch.einsum("j,i -> ji", t, inv_freq)
    heads = cos_coef.shape[0]
    pos_cos = freqs.cos().unsqueeze(0).expand(heads, -1, -1)
    pos_sin = freqs.sin().unsqueeze(0).expand(heads, -1, -1)
    sin = torch.einsum("htD, hDd -> thd", pos_sin, sin_coef.float())
    cos = torch.einsum("htD, hDd -> thd", pos_cos, cos_coef.float())
    sin = torch.nn.functional.pad(sin, (0, head_size // 2 - sin.size(-1)), value=0)
    cos = torch.nn.functional.pad(cos, (0, head_size // 2 - cos.size(-1)), value=1)
    sin, cos = torch.cat((sin, sin), dim=-1)[positions], torch.cat((cos, cos), dim=-1)[positions]

    def rotate_neox(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rotate_neox(q) * sin, k * cos + rotate_neox(k) * sin


def test_it_is_vllms_formula():
    torch.manual_seed(0)
    s = FoPE(cfg(), window=40)
    q, k = torch.randn(1, 4, 12, 16), torch.randn(1, 4, 12, 16)
    ids = torch.tensor([[0, 1, 2, 3, 7, 8, 9, 20, 21, 33, 34, 35]])
    got_q, got_k = s.rotate(q, k, ids)
    want_q, want_k = vllm_rotate(q[0].transpose(0, 1), k[0].transpose(0, 1), ids[0], s.inv_freq, s.cos_coef,
                                 s.sin_coef, 16)
    assert torch.allclose(got_q[0].transpose(0, 1), want_q, atol=1e-5)
    assert torch.allclose(got_k[0].transpose(0, 1), want_k, atol=1e-5)


def test_the_floor_clips_the_frequencies_that_do_not_complete_a_period_in_the_window():
    inv_freq = 10000.0 ** (-torch.arange(0, 16, 2).float() / 16)  # 1, 0.316, 0.1, 0.0316, ...
    assert torch.equal(kept_frequencies(10000.0, 16, 64), inv_freq[inv_freq >= 2 * math.pi / 64])
    assert len(kept_frequencies(10000.0, 16, 64)) == 3 and len(kept_frequencies(10000.0, 16, 0)) == 8
    assert FoPE(cfg()).window == 64  # window 0: model.max_positions
    s = FoPE(cfg(), window=64)
    assert s.dims == 3  # min(kept, Dh / 4 = 4)
    q = torch.randn(1, 4, 5, 16)
    rq, _ = s.rotate(q, q, torch.tensor([[0, 10, 200, 3000, 7]]))
    untouched = [d for d in range(16) if d % 8 >= 3]  # pairs 3..7 in the half layout: zero frequency
    assert torch.equal(rq[..., untouched], q[..., untouched])
    assert not torch.allclose(rq[..., 1:3], q[..., 1:3])


def test_with_identity_coefficients_and_no_clipping_it_is_rope():
    s, rope = FoPE(cfg(), window=10**9, dims=8), RoPE(cfg(position="rope"))
    s.cos_coef.copy_(torch.eye(8).expand(4, 8, 8))
    s.sin_coef.copy_(torch.eye(8).expand(4, 8, 8))
    q, k, ids = torch.randn(2, 4, 7, 16), torch.randn(2, 4, 7, 16), torch.tensor([[0, 3, 4, 9, 11, 30, 31]])
    for got, want in zip(s.rotate(q, k, ids), rope.rotate(q, k, ids)):
        assert torch.allclose(got, want, atol=1e-5)


def test_each_series_starts_at_one_and_heads_differ():
    s = FoPE(cfg(), window=64)
    cos, sin = s.cos_sin(torch.tensor([[0, 5]]))
    assert torch.allclose(cos[..., 0, :], torch.ones(1, 4, 16)) and torch.allclose(sin[..., 0, :], torch.zeros(1, 4, 16))
    assert not torch.allclose(cos[0, 0, 1], cos[0, 1, 1])  # per-head coefficients


def test_the_coefficients_are_saved_with_the_weights_and_options_are_checked():
    torch.manual_seed(1)
    a = Transformer(cfg(position_options={"window": 32, "seed": 1}), 9)
    torch.manual_seed(2)
    b = Transformer(cfg(position_options={"window": 32}), 9)
    assert not torch.equal(a.scheme.cos_coef, b.scheme.cos_coef)
    assert torch.equal(b.scheme.cos_coef, Transformer(cfg(position_options={"window": 32}), 9).scheme.cos_coef)
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(0, 9, (2, 10))
    assert torch.equal(a(tokens), b(tokens))
    for bad, what in (({"window": -1}, "window"), ({"dims": 9}, "dims"), ({"theta": 0}, "theta"),
                      ({"gain": -1.0}, "gain"), ({"window": 2}, "window"), ({"seed": 1.5}, "seed")):
        with pytest.raises(ValueError, match=f"fope .*{what}"):
            build_scheme(cfg(position_options=bad))
    torch.manual_seed(3)
    trains_with_finite_gradients(Transformer(cfg(position_options={"window": 16}), 9), torch.randint(0, 9, (4, 12)))


def test_a_new_run_gets_the_window_its_training_reaches_unless_its_config_sets_one():
    from lengthgen.assembly.runs import new_run

    run = new_run("looped/cpu/parity", ["model.position=fope"])  # Parity 1-12: IDs 0..12
    assert run.cfg.model.position_options == {"window": 13}
    assert new_run("looped/cpu/parity", ["model.position=fope", "model.position_options.window=100"]
                   ).cfg.model.position_options == {"window": 100}
    randomized = new_run("looped/cpu/parity", ["model.position=fope", "data.position_transform=randomized",
                                               "data.position_transform_options.max_position=64"])
    assert randomized.cfg.model.position_options == {"window": 64}  # the IDs training reads reach 63
    assert new_run("looped/cpu/parity", ["model.position=rope"]).cfg.model.position_options == {}
