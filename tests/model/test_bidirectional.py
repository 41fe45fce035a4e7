"""model.causal = false: bidirectional attention in every path attention can take (SDPA, a bias,
a content scheme, the math path of low precision on CPU, dropout on the logits), ALiBi's two-sided
bias as the authors' encoder has it, and the combinations refused before a run starts."""
from __future__ import annotations

import pytest
import torch

from lengthgen.assembly.runs import new_run
from lengthgen.config.schema import ModelConfig
from lengthgen.errors import ConfigError
from lengthgen.model.attention import KVCache
from lengthgen.model.positions import SCHEMES, ALiBi
from lengthgen.model.transformer import Transformer


def first_column_change(cfg: ModelConfig, dtype=torch.float32, train: bool = False) -> float:
    """How much the first column's logits move when the last token changes."""
    torch.manual_seed(0)
    model = Transformer(cfg, 9).train(train)
    x = torch.randint(0, 9, (2, 12))
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 9
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        torch.manual_seed(1)
        a = model(x)[:, 0]
        torch.manual_seed(1)
        b = model(y)[:, 0]
    return float((a.float() - b.float()).abs().max())


BOTH_WAYS = [name for name, s in SCHEMES.items() if s.bidirectional]


def test_the_schemes_that_attend_both_ways():
    assert set(BOTH_WAYS) == {"nope", "learned", "sinusoidal", "rope", "alibi", "relative", "fope"}


@pytest.mark.parametrize("position", BOTH_WAYS)
def test_an_encoder_column_sees_later_columns_and_a_decoder_column_does_not(position):
    for causal in (True, False):
        cfg = ModelConfig(d_model=16, n_head=2, n_layer=2, position=position, causal=causal)
        moved = first_column_change(cfg)
        assert (moved > 1e-6) == (not causal), (position, causal, moved)


@pytest.mark.parametrize("case", ["bf16-math", "logit-dropout", "weight-dropout"])
def test_the_other_attention_paths_are_bidirectional_too(case):
    extra = {"logit-dropout": dict(attn_dropout=0.1, attn_dropout_on="logits"),
             "weight-dropout": dict(attn_dropout=0.1)}.get(case, {})
    dtype = torch.bfloat16 if case == "bf16-math" else torch.float32
    for causal in (True, False):
        cfg = ModelConfig(d_model=16, n_head=2, n_layer=1, causal=causal, **extra)
        moved = first_column_change(cfg, dtype, train=case != "bf16-math")
        assert (moved > 1e-6) == (not causal), (case, causal, moved)


def test_two_sided_alibi_is_the_authors_bias():
    """Their compute_alibi_encodings_biases: slope * (-|i - j| + 0.5 [j < i])."""
    scheme = ALiBi(ModelConfig(n_head=2, position="alibi", causal=False))
    bias = scheme.bias(torch.arange(4)[None])[0]  # (H, T, T)
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    want = -(i - j).abs().float() + 0.5 * (j < i).float()
    for h, slope in enumerate(scheme.slopes):
        assert torch.allclose(bias[h], slope * want)


def test_a_kv_cache_needs_causal_attention():
    model = Transformer(ModelConfig(d_model=16, n_head=2, n_layer=1, causal=False), 5)
    with pytest.raises(ValueError, match="model.causal"):
        model.run_blocks(torch.zeros(1, 3, 16), torch.arange(3)[None], cache=KVCache())


@pytest.mark.parametrize("sets, needle", [
    (["method=ntp"], "model.causal = false .* method ntp"),
    (["method=looped"], "model.causal = false .* method looped"),
    (["model.position=tra"], "model.causal = false .* model.position tra"),
    (["model.position=cope"], "model.causal = false .* model.position cope"),
    (["model.position=fox"], "model.causal = false .* model.position fox"),
    (["model.position=t5"], "model.causal = false .* model.position t5"),
    (["model.position=fire"], "model.causal = false .* model.position fire"),
])
def test_what_cannot_be_bidirectional_is_refused_in_one_line(sets, needle):
    with pytest.raises(ConfigError, match=needle):
        new_run(None, ["method=encoder", "task.name=parity_check", "model.causal=false", *sets])
