"""TRA and CoPE: the attention functions the model runs, against references written
independently from the formulas (plain loops over queries and keys, float64), and the
properties that define them."""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.config.schema import ModelConfig
from lengthgen.model import content_attention
from lengthgen.model.content_attention import cope_attention, tra_attention
from lengthgen.model.transformer import Transformer


pytestmark = pytest.mark.usefixtures("one_thread")


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tra_by_loops(q, k, v, gate_logit):
    """For each query i: normalise, score every earlier key, keep the positive ones, give
    each kept key j the count of kept keys between j and i, softmax over the kept keys."""
    q, k, v, gate_logit = (t.double() for t in (q, k, v, gate_logit))
    B, H, T, Dh = q.shape
    rms = lambda t: t / torch.sqrt((t * t).mean() + torch.finfo(torch.float32).eps)  # noqa: E731
    out = torch.zeros(B, H, T, Dh, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                qi = rms(q[b, h, i])
                score = {j: max(0.0, float(qi @ rms(k[b, h, j])) / math.sqrt(Dh)) for j in range(i + 1)}
                kept = [j for j in range(i + 1) if score[j] > 0]
                if not kept:
                    continue  # no kept key: the output stays 0
                gate = float(F.logsigmoid(gate_logit[b, h, i]))
                logit = {j: score[j] + sum(1 for m in kept if j <= m <= i) * gate for j in kept}
                top = max(logit.values())
                weight = {j: math.exp(logit[j] - top) for j in kept}
                total = sum(weight.values())
                out[b, h, i] = sum(weight[j] / total * v[b, h, j] for j in kept)
    return out


def cope_by_loops(q, k, v, pos_emb, npos_max):
    """For each query i: gates of every earlier key, its position the sum of the gates from
    it to i (capped), the position logit interpolated between the integers around it."""
    q, k, v, pos_emb = (t.double() for t in (q, k, v, pos_emb))
    B, H, T, Dh = q.shape
    out = torch.zeros(B, H, T, Dh, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                gate = [1 / (1 + math.exp(-float(q[b, h, i] @ k[b, h, j]) / math.sqrt(Dh))) for j in range(i + 1)]
                logits = []
                for j in range(i + 1):
                    p = min(sum(gate[j:i + 1]), npos_max - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    z_lo, z_hi = float(q[b, h, i] @ pos_emb[:, lo]), float(q[b, h, i] @ pos_emb[:, hi])
                    z = z_lo + (p - lo) * (z_hi - z_lo)
                    logits.append((float(q[b, h, i] @ k[b, h, j]) + z) / math.sqrt(Dh))
                w = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                out[b, h, i] = (w[:, None] * v[b, h, :i + 1]).sum(0)
    return out


@pytest.mark.parametrize("chunk", [0, 3])
def test_tra_matches_its_formula(chunk):
    q, k, v, g = rand(2, 2, 9, 4, seed=1), rand(2, 2, 9, 4, seed=2), rand(2, 2, 9, 4, seed=3), rand(2, 2, 9, seed=4)
    got = tra_attention(q, k, v, g, chunk=chunk)
    want = tra_by_loops(q, k, v, g)
    assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()
    assert (want == 0).all(-1).any()  # some query kept no key: the case is exercised


@pytest.mark.parametrize("chunk", [0, 4])
def test_cope_matches_its_formula(chunk):
    q, k, v = rand(2, 2, 9, 4, seed=5) * 2, rand(2, 2, 9, 4, seed=6) * 2, rand(2, 2, 9, 4, seed=7)
    npos = 5  # small, so the cap at npos_max - 1 is reached
    pos_emb = rand(4, npos, seed=8)
    got = cope_attention(q, k, v, pos_emb, chunk=chunk)  # npos_max: pos_emb's width
    want = cope_by_loops(q, k, v, pos_emb, npos)
    assert torch.allclose(got.double(), want, atol=1e-5), (got.double() - want).abs().max()


def test_tra_ignores_keys_below_threshold_wherever_they_are_inserted():
    """Keys scoring below 0 for the last query are dropped: they take no weight and do not
    count in the distance of the keys before them."""
    q, k, v, g = rand(1, 2, 8, 4, seed=9), rand(1, 2, 8, 4, seed=10), rand(1, 2, 8, 4, seed=11), rand(1, 2, 8, seed=12)
    last = tra_attention(q, k, v, g)[:, :, -1]
    for at in (0, 3, 7):  # before the first key, in the middle, just before the query
        away = -q[:, :, -1:]  # a key pointing away from the last query: its score is < 0
        k2 = torch.cat([k[:, :, :at], away, k[:, :, at:]], 2)
        v2 = torch.cat([v[:, :, :at], rand(1, 2, 1, 4, seed=at) * 100, v[:, :, at:]], 2)
        q2 = torch.cat([q[:, :, :at], rand(1, 2, 1, 4, seed=50 + at), q[:, :, at:]], 2)
        g2 = torch.cat([g[:, :, :at], rand(1, 2, 1, seed=60 + at), g[:, :, at:]], 2)
        assert torch.allclose(tra_attention(q2, k2, v2, g2)[:, :, -1], last, atol=1e-6), at


def test_tra_distance_counts_only_kept_keys():
    """Kept keys with equal scores, dropped keys between them: the weights fall off by the
    gate per kept key (1, e^g, e^2g, ... from the most recent), whatever lies between."""
    Dh, g = 4, -0.7
    q = torch.ones(1, 1, 1, Dh)
    toward, away = torch.ones(Dh), -torch.ones(Dh)
    pattern = [toward, away, away, toward, away, toward, toward, away]  # kept at 0, 3, 5, 6
    k = torch.stack(pattern)[None, None]
    queries = torch.cat([torch.zeros(1, 1, len(pattern) - 1, Dh), q], 2)  # only the last query matters
    gate_logit = torch.full((1, 1, len(pattern)), math.log(math.exp(-g) - 1) * -1)  # logsigmoid(x) = g
    assert torch.allclose(F.logsigmoid(gate_logit), torch.tensor(g))
    weights = []
    tra_attention(queries, k, torch.randn(1, 1, len(pattern), Dh), gate_logit, keep=weights)
    w = weights[0][0, 0, -1]  # the last query's weights over the 8 keys
    assert (w[[1, 2, 4, 7]] == 0).all()
    kept = w[[6, 5, 3, 0]]  # most recent kept first: distances 1, 2, 3, 4
    ratios = kept[1:] / kept[:-1]
    assert torch.allclose(ratios, torch.full((3,), math.exp(g)), rtol=1e-5), ratios


def test_cope_positions_count_only_gated_tokens():
    """Keys whose gate is ~0 (q . k very negative) add nothing to the positions of the
    others and take ~no weight: inserting them leaves the last query's output as it was."""
    q, k, v = rand(1, 2, 6, 4, seed=13), rand(1, 2, 6, 4, seed=14), rand(1, 2, 6, 4, seed=15)
    pos_emb = rand(4, 8, seed=16)
    last = cope_attention(q, k, v, pos_emb)[:, :, -1]
    shut = -40 * q[:, :, -1:] / q[:, :, -1:].norm(dim=-1, keepdim=True)  # q . k = -40 |q|: gate ~ e^-20
    for at in (1, 4):
        k2 = torch.cat([k[:, :, :at], shut, shut, k[:, :, at:]], 2)
        v2 = torch.cat([v[:, :, :at], torch.ones(1, 2, 2, 4), v[:, :, at:]], 2)
        q2 = torch.cat([q[:, :, :at], rand(1, 2, 2, 4, seed=at), q[:, :, at:]], 2)
        assert torch.allclose(cope_attention(q2, k2, v2, pos_emb)[:, :, -1], last, atol=1e-5), at
    # whereas a key with gate ~1 moves every earlier key one position further away
    open_ = 40 * q[:, :, -1:] / q[:, :, -1:].norm(dim=-1, keepdim=True)
    k3 = torch.cat([k[:, :, :3], open_, k[:, :, 3:]], 2)
    v3 = torch.cat([v[:, :, :3], torch.zeros(1, 2, 1, 4), v[:, :, 3:]], 2)
    q3 = torch.cat([q[:, :, :3], rand(1, 2, 1, 4, seed=99), q[:, :, 3:]], 2)
    assert not torch.allclose(cope_attention(q3, k3, v3, pos_emb)[:, :, -1], last, atol=1e-3)


@pytest.mark.parametrize("position", ["tra", "cope"])
def test_chunked_queries_give_the_unchunked_result_and_gradients(position):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_head=4, n_layer=2, position=position)
    whole = Transformer(cfg, 11)
    chunked = Transformer(ModelConfig(**{**cfg.__dict__, "position_options": {"chunk": 7}}), 11)
    chunked.load_state_dict(whole.state_dict())
    with torch.no_grad():  # CoPE's position vectors start at 0: give them values to check
        for a, b in zip(whole.scheme.parameters(), chunked.scheme.parameters()):
            a.normal_()
            b.copy_(a)
    x = torch.randint(0, 11, (2, 30), generator=torch.Generator().manual_seed(1))
    assert chunked.scheme.chunk == 7 and whole.scheme.chunk == 512
    out_whole, out_chunked = whole(x), chunked(x)
    assert torch.allclose(out_whole, out_chunked, atol=1e-5)
    out_whole.square().mean().backward()
    out_chunked.square().mean().backward()
    for (name, a), b in zip(whole.named_parameters(), chunked.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5), name


def test_a_chunk_never_builds_the_whole_window():
    """Chunked, the largest score matrix holds chunk x window entries, not window x window."""
    sizes = []
    original = torch.Tensor.__matmul__

    def spy(a, b):
        out = original(a, b)
        sizes.append(out.shape[-2] * out.shape[-1])
        return out

    q, k, v, g = rand(1, 1, 200, 4), rand(1, 1, 200, 4, seed=1), rand(1, 1, 200, 4, seed=2), rand(1, 1, 200, seed=3)
    torch.Tensor.__matmul__ = spy
    try:
        tra_attention(q, k, v, g, chunk=16)
        cope_attention(q, k, v, rand(4, 8), chunk=16)
    finally:
        torch.Tensor.__matmul__ = original
    assert max(sizes) <= 16 * 200


def test_a_large_batch_takes_fewer_queries_per_chunk(monkeypatch):
    """The score budget caps a chunk: 8 rows x 200 keys with a budget of 3200 scores -> 2 queries per chunk."""
    monkeypatch.setattr(content_attention, "MAX_CHUNK_SCORES", 3200)
    assert content_attention.query_spans(200, 512, rows=8)[:2] == [(0, 2), (2, 4)]
    assert content_attention.query_spans(200, 0, rows=8) == [(0, 200)]  # 0 stays "all at once"
    assert content_attention.query_spans(200, 512, rows=10 ** 6)[0] == (0, 1)  # never below one query
    q, k, v, g = rand(2, 4, 200, 4), rand(2, 4, 200, 4, seed=1), rand(2, 4, 200, 4, seed=2), rand(2, 4, 200, seed=3)
    assert torch.allclose(tra_attention(q, k, v, g, chunk=512), tra_attention(q, k, v, g, chunk=0), atol=1e-5)
    pos_emb = rand(4, 8)
    assert torch.allclose(cope_attention(q, k, v, pos_emb, chunk=512), cope_attention(q, k, v, pos_emb), atol=1e-5)
