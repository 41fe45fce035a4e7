"""Sparse dependence in natural language: the per-token, fixed-context evaluation, the ablation at
original position IDs, attention recorded for every scheme, the bisection for k(t) against a
brute-force search on a planted dependency, and the configuration's errors (the C4 loader: tests/tasks/test_hub_corpus.py; the
reproduction: tests/reproduction/test_sparsity_lm_grid.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import ModelConfig
from lengthgen.errors import ConfigError
from lengthgen.evaluation.dependence import Dependence, attention_ranks, bisect_k, leave_one_out_ranks, measure
from lengthgen.evaluation.language_model import (Scorer, ablated_losses, context_losses, documents, scored_tokens,
                                                 token_losses)
from lengthgen.methods.base import Method
from lengthgen.methods.next_token import NextTokenPrediction
from lengthgen.model.attention import recording
from lengthgen.model.positions import SCHEMES, PositionalScheme
from lengthgen.model.transformer import Transformer
from lengthgen.tasks import EOS, get_task

from tests.helpers.documents import docs, lm_overrides, write_documents  # noqa: F401  (docs is a fixture)

NTP = NextTokenPrediction()


def tiny_model(position: str, seed: int = 0, vocab: int = 259, **options) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_layer=2, n_head=2, position=position, position_options=options, max_positions=512)
    return Transformer(cfg, vocab).eval()


def toy_stream(lengths, seed=0, vocab=40) -> np.ndarray:
    """Documents of the given lengths (tokens 3..vocab-1), each followed by EOS."""
    rng = np.random.default_rng(seed)
    parts = []
    for n in lengths:
        parts += [rng.integers(3, vocab, n), [EOS]]
    return np.concatenate(parts).astype(np.int64)


def brute_loss(model, tokens, ids, target) -> float:
    """-log p(target | tokens at IDs ids) from one plain forward pass, written out by hand."""
    with torch.no_grad():
        logits = model(torch.tensor([[int(x) for x in tokens]]), torch.tensor([[int(i) for i in ids]]))[0, -1]
    return float(F.cross_entropy(logits[None].double(), torch.tensor([int(target)])))


class Recorder(Method):
    """A next-token method that records every row it is asked to score (its real tokens and IDs)."""

    def __init__(self):
        self.seen = []

    def last_logits(self, model, batch, last):
        for b, col in enumerate(last.tolist()):
            self.seen.append((batch.inputs[b, :col + 1].tolist(), batch.position_ids[b, :col + 1].tolist(),
                              int(batch.targets[b, col])))
        return torch.zeros(len(last), 259)


# -- per token, fixed context ------------------------------------------------------------------------

def test_documents_are_the_tokens_between_eos():
    stream = np.array([5, 6, EOS, 7, EOS, EOS, 8, 9, 10, EOS])
    starts, ends = documents(stream)
    assert [stream[s:e].tolist() for s, e in zip(starts, ends)] == [[5, 6], [7], [8, 9, 10]]
    starts, ends = documents(np.array([5, EOS, 6, 7]))  # no final EOS: the last document runs to the end
    assert [(int(s), int(e)) for s, e in zip(starts, ends)] == [(0, 1), (2, 4)]


@pytest.mark.parametrize("contexts,stride", [([4, 8, 16], 1), ([3, 16], 5), ([16], 3)])
def test_the_sliding_evaluation_scores_each_token_once_per_context_with_exactly_c_tokens(contexts, stride):
    lengths = [30, 16, 5, 17, 40, 0, 22]  # a document no longer than max(c) is dropped; an empty one too
    stream = toy_stream(lengths)
    docs = [stream[s:e].tolist() for s, e in zip(*documents(stream))]
    longest = max(contexts)
    expected = [(d, p) for d, doc in enumerate(docs) for p in range(longest, len(doc), stride)]  # brute force
    recorder = Recorder()
    for c in contexts:
        recorder.seen.clear()
        context_losses(Scorer(recorder, None, 37, torch.device("cpu")), stream,
                       scored_tokens(stream, longest, stride)["index"], c)
        assert len(recorder.seen) == len(expected)  # each token once per context
        for (d, p), (tokens, ids, target) in zip(expected, recorder.seen):
            assert tokens == docs[d][p - c:p] and target == docs[d][p]  # exactly the c tokens before it
            assert ids == list(range(c)) and EOS not in tokens  # never across a document boundary
    picked = scored_tokens(stream, longest, stride)
    assert list(zip(picked["document"].tolist(), picked["position"].tolist())) == expected


def test_token_losses_equal_one_forward_pass_per_token(docs):
    folder, _ = docs
    task = get_task("text", source="files", path=str(folder))
    model = tiny_model("rope")
    out = token_losses(task, Scorer(NTP, model, 100, torch.device("cpu")), [8, 24], stride=97, limit=25)
    stream = task.corpus.tokens("test")
    starts, _ = documents(stream)
    assert len(out["document"]) == 25 and len(set(out["document"].tolist())) > 1  # the limit spreads over documents
    for i in range(0, 25, 4):
        t = int(starts[out["document"][i]] + out["position"][i])
        assert out["token"][i] == stream[t]
        for c in (8, 24):
            assert out[f"loss_{c}"][i] == pytest.approx(brute_loss(model, stream[t - c:t], range(c), stream[t]), abs=1e-5)


# -- ablation at original positions ----------------------------------------------------------------

@pytest.mark.parametrize("position", ["rope", "alibi", "nope", "tra", "cope"])
def test_ablation_keeping_every_far_token_is_the_full_context_and_none_the_near_window(position):
    stream = toy_stream([80, 70], seed=1)
    model = tiny_model(position, seed=2)
    near, full = 8, 32
    index = scored_tokens(stream, full, stride=9)["index"]
    cpu = torch.device("cpu")
    every = [np.arange(near + 1, full + 1)] * len(index)
    none = [np.zeros(0, np.int64)] * len(index)
    scorer = Scorer(NTP, model, 64, cpu)
    np.testing.assert_allclose(ablated_losses(scorer, stream, index, every, near, full),
                               context_losses(scorer, stream, index, full), atol=2e-5)
    # none kept: the near window at IDs full - near .. full - 1, the same distances as 0 .. near - 1
    np.testing.assert_allclose(ablated_losses(scorer, stream, index, none, near, full),
                               context_losses(scorer, stream, index, near), atol=2e-5)


def test_kept_tokens_keep_their_original_position_ids_and_the_loss_is_a_forward_pass_over_them():
    stream = toy_stream([90], seed=3)
    near, full = 6, 40
    index = np.array([50, 71, 89])
    far = [np.array([7, 40, 13]), np.array([39]), np.array([], np.int64)]
    recorder = Recorder()
    ablated_losses(Scorer(recorder, None, 1000, torch.device("cpu")), stream, index, far, near, full)
    got = {target: (tokens, ids) for tokens, ids, target in recorder.seen}
    model = tiny_model("rope", seed=4)
    losses = ablated_losses(Scorer(NTP, model, 1000, torch.device("cpu")), stream, index, far, near, full)
    for t, d, loss in zip(index, far, losses):
        kept = sorted([t - x for x in d] + list(range(t - near, t)))  # stream positions, in order
        tokens, ids = got[int(stream[t])]
        assert tokens == [int(stream[j]) for j in kept]
        assert ids == [j - (t - full) for j in kept]  # each token's ID in the window of the full context
        assert loss == pytest.approx(brute_loss(model, stream[kept], [j - (t - full) for j in kept], stream[t]), abs=1e-5)


# -- attention recorded for every scheme --------------------------------------------------------------

@pytest.mark.parametrize("position", sorted(SCHEMES))
def test_every_scheme_records_attention_without_changing_the_output(position):
    model = tiny_model(position, seed=5)
    inputs = torch.randint(3, 259, (3, 20))
    with torch.no_grad():
        plain = model(inputs)
        with recording(model) as recorder:
            recorded = model(inputs)
        weights = {layer: torch.cat(chunks, 2) for layer, chunks in recorder.weights.items()}
        with recording(model, last_only=True) as recorder:
            model(inputs)
        last = {layer: chunks[-1] for layer, chunks in recorder.weights.items()}
        with recording(model) as recorder:
            pass
        model(inputs)
    assert recorder.weights == {}  # outside the block nothing is recorded
    torch.testing.assert_close(recorded, plain)
    assert sorted(weights) == [0, 1]
    for layer, w in weights.items():
        assert w.shape == (3, 2, 20, 20)
        assert float(w.triu(1).abs().max()) == 0  # nothing from the future
        sums = w.sum(-1)
        assert torch.all((sums - 1).abs() < 1e-5) or position == "tra"  # a TRA query may keep no key: 0
        assert torch.all(sums < 1 + 1e-5)
        torch.testing.assert_close(last[layer], w[:, :, -1:, :])


@pytest.mark.parametrize("position", ["nope", "rope", "alibi"])
def test_recorded_weights_of_the_first_layer_equal_a_softmax_written_by_hand(position):
    model = tiny_model(position, seed=6)
    inputs, T = torch.randint(3, 259, (2, 12)), 12
    ids = torch.arange(T)[None]
    with torch.no_grad():
        with recording(model) as recorder:
            model(inputs)
        got = recorder.weights[0][0]
        block = model.blocks[0]
        h = block.ln_1(model.embed(inputs, ids))
        q, k, _ = block.attn.c_attn(h).split(32, dim=2)
        q, k = (x.view(2, T, 2, 16).transpose(1, 2) for x in (q, k))
        q, k = model.scheme.rotate(q, k, ids)
        logits = q @ k.transpose(-2, -1) / 4.0
        if position == "alibi":
            slopes = torch.tensor([2 ** -4, 2 ** -8])  # ALiBi's slopes for two heads
            logits = logits - slopes[None, :, None, None] * (ids[0][:, None] - ids[0][None, :]).float()
        logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(got, torch.softmax(logits, -1), atol=1e-5, rtol=1e-5)


# -- k(t) by bisection against brute force, on a planted dependency ------------------------------------

V = 11  # symbols 3 .. 3 + V - 1


def planted_stream(offsets, docs=3, length=60, seed=0) -> np.ndarray:
    """Documents whose token t, from max(offsets) on, is the sum (mod V) of the tokens at the far
    offsets t - o: it depends on exactly len(offsets) far tokens; the rest are random."""
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(docs):
        x = list(rng.integers(0, V, max(offsets)))
        for t in range(max(offsets), length):
            x.append(sum(x[t - o] for o in offsets) % V)
        parts += [np.array(x) + 3, [EOS]]
    return np.concatenate(parts).astype(np.int64)


class PlantedReader(Method):
    """An oracle of the planted corpus that reads position IDs: for the token after the last
    input (ID = last ID + 1) it looks for the inputs at IDs (that ID - o). `sharp`: only all of
    them give the sum, so it puts 0.98 on that symbol when it finds all and is uniform otherwise.
    Graded (not sharp): a toy of a dependence that accumulates, it is told the right symbol and
    each planted token found moves a share 0.98 / K of its belief onto it, so recovery grows with
    every planted token kept. Its "attention" (recorded like a model's inside `recording`)
    falls on the planted tokens it finds, and a little on every other token."""

    def __init__(self, offsets, sharp=True):
        self.offsets, self.sharp = offsets, sharp

    def last_logits(self, model, batch, last):
        out = torch.zeros(len(last), 3 + V)
        rows = []
        for b, col in enumerate(last.tolist()):
            ids, tokens = batch.position_ids[b, :col + 1].tolist(), batch.inputs[b, :col + 1].tolist()
            at = {i: x for i, x in zip(ids, tokens)}
            target_id = ids[-1] + 1
            found = [at[target_id - o] - 3 for o in self.offsets if target_id - o in at]
            guess = 3 + sum(found) % V if self.sharp else int(batch.targets[b, col])
            share = len(found) / len(self.offsets) if not self.sharp else float(len(found) == len(self.offsets))
            out[b, :] = -30.0  # the specials: never
            out[b, 3:] = math.log((1 - 0.98 * share) / V)
            out[b, guess] = math.log((1 - 0.98 * share) / V + 0.98 * share)
            w = torch.full((batch.inputs.shape[1],), 0.01)
            for o in self.offsets:
                if target_id - o in at:
                    w[ids.index(target_id - o)] = 1.0
            rows.append(w / w.sum())
        if model.recorder is not None:  # installed by `recording`, as on a model's attention layers
            model.recorder.add(0, torch.stack(rows)[:, None, None, :])
        return out


def planted_k(K, sharp, epsilon):
    """The answer from the reader's definition: the fewest planted tokens j whose loss, -log of
    the probability it then gives the right symbol, recovers (1 - epsilon) of the whole benefit."""
    def loss(j):
        share = float(j == K) if sharp else j / K
        return -math.log((1 - 0.98 * share) / V + 0.98 * share)
    return next(j for j in range(K + 1) if loss(0) - loss(j) >= (1 - epsilon) * (loss(0) - loss(K)))


class Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scheme = PositionalScheme(ModelConfig())
        self.recorder = None  # a slot `recording` fills


def brute_force_k(method, model, stream, t, ranked, near, full, near_loss, full_loss, epsilon):
    """Every m = 0 .. F by hand: the input built token by token, one pass each; the first m whose
    recovery reaches 1 - epsilon, and the recovery at every m."""
    recovery = []
    for m in range(len(ranked) + 1):
        kept = sorted([t - d for d in ranked[:m]] + list(range(t - near, t)))
        inputs = torch.tensor([[int(stream[j]) for j in kept]])
        ids = torch.tensor([[j - (t - full) for j in kept]])
        from lengthgen.tasks import Batch

        n = torch.tensor([len(kept)])
        targets = torch.full_like(inputs, -100)
        targets[0, -1] = int(stream[t])
        batch = Batch(inputs=inputs, targets=targets, question_len=n, lengths=n, n_steps=n, position_ids=ids)
        logits = method.last_logits(model, batch, torch.tensor([len(kept) - 1]))
        loss = float(F.cross_entropy(logits.double(), torch.tensor([int(stream[t])])))
        recovery.append((near_loss - loss) / (near_loss - full_loss))
    return next(m for m, r in enumerate(recovery) if r >= 1 - epsilon), recovery


@pytest.mark.parametrize("offsets,sharp,rank", [((13,), True, "leave_one_out"), ((11, 17), True, "attention"),
                                                ((9, 14, 20, 27), True, "leave_one_out"),
                                                ((9, 14, 20, 27, 30), False, "attention"),
                                                ((10, 12, 25), False, "leave_one_out")])
def test_bisection_finds_the_planted_k_as_brute_force_does(offsets, sharp, rank):
    near, full, epsilon = 6, 32, 0.1
    stream = planted_stream(offsets)
    method, model = PlantedReader(offsets, sharp), Holder()
    cpu = torch.device("cpu")
    scored = scored_tokens(stream, full, stride=3)
    losses = {"document": scored["document"], "position": scored["position"], "token": stream[scored["index"]]}
    for c in (near, full):
        losses[f"loss_{c}"] = context_losses(Scorer(method, model, 500, cpu), stream, scored["index"], c)
    rows, cost = measure(Scorer(method, model, 500, cpu), stream, losses, [near, full],
                         {"tau": 0.5, "rank": rank, "epsilon": epsilon})
    assert len(rows) == len(scored["index"]) and cost["tokens"] == len(rows)  # every token depends on far ones
    F_far = full - near
    assert cost["bisection_passes"] <= len(rows) * math.ceil(math.log2(F_far))  # bisection, not a scan
    starts, _ = documents(stream)
    for row in rows[::3]:
        t = int(starts[row["document"]] + row["position"])
        near_loss, full_loss = (float(losses[f"loss_{c}"][(scored["index"] == t)][0]) for c in (near, full))
        # the ranking the search used: the planted far tokens first (recorded with the row: its top k)
        index = np.array([t])
        if rank == "attention":
            ranked = attention_ranks(Scorer(method, model, 500, cpu), stream, index, near, full)[0][0]
        else:
            ranked = leave_one_out_ranks(Scorer(method, model, 500, cpu), stream, index, near, full,
                                         np.array([full_loss]))[0][0]
        k, recovery = brute_force_k(method, model, stream, t, ranked, near, full, near_loss, full_loss, epsilon)
        assert all(b >= a - 1e-9 for a, b in zip(recovery, recovery[1:]))  # monotone on the planted toy
        assert recovery[0] == pytest.approx(0, abs=1e-6) and recovery[-1] == pytest.approx(1, abs=1e-6)
        assert row["k"] == k
        assert k == planted_k(len(offsets), sharp, epsilon)
        assert set(row["far"]) <= set(offsets) and len(row["far"]) == k  # the planted tokens, nothing else
        assert row["recovery"] >= 1 - epsilon


def test_bisection_on_a_real_model_is_minimal_where_it_stops():
    """Without monotonicity nothing guarantees the fewest tokens; bisection guarantees that k
    recovers enough and k - 1 does not. Checked on a random RoPE model, token by token."""
    stream = toy_stream([120, 90], seed=7)
    model = tiny_model("rope", seed=8)
    near, full, cpu = 4, 24, torch.device("cpu")
    index = scored_tokens(stream, full, stride=5)["index"]
    scorer = Scorer(NTP, model, 500, cpu)
    near_loss = context_losses(scorer, stream, index, near)
    full_loss = context_losses(scorer, stream, index, full)
    keep = near_loss - full_loss > 0.01
    index, near_loss, full_loss = index[keep], near_loss[keep], full_loss[keep]
    ranks, _ = attention_ranks(scorer, stream, index, near, full)

    def loss_of(rows, m):
        return ablated_losses(scorer, stream, index[rows], [ranks[r, :c] for r, c in zip(rows, m)], near, full)

    k, at_k, _ = bisect_k(loss_of, ranks, near_loss, full_loss, 0.2)
    rows = np.arange(len(index))
    need = 0.8 * (near_loss - full_loss)
    np.testing.assert_allclose(at_k, loss_of(rows, k), atol=1e-6)
    assert np.all(near_loss - loss_of(rows, k) >= need - 1e-9)
    assert np.all(near_loss - loss_of(rows, k - 1) < need)


# -- configuration ----------------------------------------------------------------------------------

def test_bad_token_evaluation_settings_are_one_line_errors_naming_the_key(docs):
    folder, _ = docs
    base = lm_overrides(folder)
    for extra, message in [
        (["eval.token_contexts=[8, 8]"], "eval.token_contexts must be distinct"),
        (["eval.token_contexts=[0, 8]"], "eval.token_contexts must be distinct integers"),
        (["eval.token_stride=0", "eval.token_contexts=[8]"], "eval.token_stride must be >= 1"),
        (["eval.dependence=true", "eval.token_contexts=[8]"], "eval.dependence needs eval.token_contexts with two"),
        (["eval.dependence_options={taus=0.1}"], "eval.dependence_options.taus is not an option"),
        (["eval.dependence_options={rank='random'}"], "eval.dependence_options: rank 'random' is unknown"),
        (["eval.dependence_options={epsilon=1.0}"], "epsilon must be in [0, 1)"),
        (["eval.token_contexts=[8, 600]", "model.position=learned", "model.max_positions=512"], "past model.max_positions"),
    ]:
        with pytest.raises(ConfigError) as err:
            new_run_config("experiments/lm/cpu/text.toml", base + extra)
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="not a language-model task"):
        new_run_config("experiments/core/parity-ntp.toml", ["eval.token_contexts=[4]"])
    assert Dependence().rank == "attention"
