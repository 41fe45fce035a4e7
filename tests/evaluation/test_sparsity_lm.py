"""Sparse dependence in natural language: the per-token, fixed-context evaluation, the ablation at
original position IDs, attention recorded for every scheme, the bisection for k(t) against a
brute-force search on a planted dependency, the configuration's errors and the C4 loader."""
from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lengthgen.config import presets
from lengthgen.config.schema import ModelConfig
from lengthgen.errors import ConfigError
from lengthgen.evaluation.dependence import Dependence, attention_ranks, bisect_k, leave_one_out_ranks, measure
from lengthgen.evaluation.language_model import ablated_losses, context_losses, documents, scored_tokens, token_losses
from lengthgen.methods.registry import Method, NextTokenPrediction
from lengthgen.model.attention import recording
from lengthgen.model.positions import SCHEMES, PositionalScheme
from lengthgen.model.transformer import Transformer
from lengthgen.tasks import EOS, get_task
from lengthgen.tasks.corpus import Corpus, c4_split_of

from test_lm import docs, lm_overrides, write_documents  # noqa: F401  (docs is a fixture)

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
        context_losses(recorder, None, stream, scored_tokens(stream, longest, stride)["index"], c, 37,
                       torch.device("cpu"))
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
    out = token_losses(task, NTP, model, [8, 24], stride=97, limit=25, batch_tokens=100, device=torch.device("cpu"))
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
    np.testing.assert_allclose(ablated_losses(NTP, model, stream, index, every, near, full, 64, cpu),
                               context_losses(NTP, model, stream, index, full, 64, cpu), atol=2e-5)
    # none kept: the near window at IDs full - near .. full - 1, the same distances as 0 .. near - 1
    np.testing.assert_allclose(ablated_losses(NTP, model, stream, index, none, near, full, 64, cpu),
                               context_losses(NTP, model, stream, index, near, 64, cpu), atol=2e-5)


def test_kept_tokens_keep_their_original_position_ids_and_the_loss_is_a_forward_pass_over_them():
    stream = toy_stream([90], seed=3)
    near, full = 6, 40
    index = np.array([50, 71, 89])
    far = [np.array([7, 40, 13]), np.array([39]), np.array([], np.int64)]
    recorder = Recorder()
    ablated_losses(recorder, None, stream, index, far, near, full, 1000, torch.device("cpu"))
    got = {target: (tokens, ids) for tokens, ids, target in recorder.seen}
    model = tiny_model("rope", seed=4)
    losses = ablated_losses(NTP, model, stream, index, far, near, full, 1000, torch.device("cpu"))
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
        losses[f"loss_{c}"] = context_losses(method, model, stream, scored["index"], c, 500, cpu)
    rows, cost = measure(method, model, stream, losses, [near, full], {"tau": 0.5, "rank": rank, "epsilon": epsilon},
                         500, cpu)
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
            ranked = attention_ranks(method, model, stream, index, near, full, 500, cpu)[0][0]
        else:
            ranked = leave_one_out_ranks(method, model, stream, index, near, full, np.array([full_loss]), 500, cpu)[0][0]
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
    near_loss = context_losses(NTP, model, stream, index, near, 500, cpu)
    full_loss = context_losses(NTP, model, stream, index, full, 500, cpu)
    keep = near_loss - full_loss > 0.01
    index, near_loss, full_loss = index[keep], near_loss[keep], full_loss[keep]
    ranks, _ = attention_ranks(NTP, model, stream, index, near, full, 500, cpu)

    def loss_of(rows, m):
        return ablated_losses(NTP, model, stream, index[rows], [ranks[r, :c] for r, c in zip(rows, m)], near, full, 500, cpu)

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
            presets.load("experiments/lm/cpu/text.toml", base + extra)
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="not a language-model task"):
        presets.load("experiments/core/parity-ntp.toml", ["eval.token_contexts=[4]"])
    assert Dependence().rank == "attention"


# -- C4 ---------------------------------------------------------------------------------------------

def test_c4_loads_a_local_copy_in_the_hub_layout(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "c4" / "en"
    folder.mkdir(parents=True)
    texts = {"train": [f"train document {i} " * 3 for i in range(7)],
             "validation": [f"validation document {i}" for i in range(40)]}
    for split, shards in (("train", 2), ("validation", 1)):
        for shard in range(shards):
            with gzip.open(folder / f"c4-{split}.{shard:05d}-of-{shards:05d}.json.gz", "wt") as f:
                for text in texts[split][shard::shards] if shards > 1 else texts[split]:
                    f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": "https://x"}) + "\n")
    corpus = Corpus("c4", str(tmp_path / "c4"))
    train = [t for _, t in corpus.documents("train")]
    assert sorted(train) == sorted(texts["train"])
    val, test = ([t for _, t in corpus.documents(s)] for s in ("validation", "test"))
    assert val == [t for i, t in enumerate(texts["validation"]) if c4_split_of(i) == "validation"]
    assert test == [t for i, t in enumerate(texts["validation"]) if c4_split_of(i) == "test"]
    assert val and test and not set(val) & set(test)
    stream = corpus.tokens("test")
    assert corpus.decode(stream[:len(test[0].encode())]) == test[0]
    capped = Corpus("c4", str(tmp_path / "c4"), max_documents=3)
    assert len(capped.documents("train")) == 3 and capped.key() != corpus.key()
    assert len(capped.documents("test")) == 3
    with pytest.raises(ValueError, match="max_documents"):
        Corpus("c4", str(tmp_path / "c4"), max_documents=-1)
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.raises(Exception, match="hub's layout"):
        Corpus("c4", str(empty)).documents("train")


# -- the reproduction: a reference and short models, paired by seed in the report ----------------------

TOY_GRID = """
title = "Sparse dependence, toy"
seeds = 2
[tasks.text]
[arms.long]
set = {"model.position" = "rope", "eval.dependence" = true}
multiply = {"task.train_min" = 4, "task.train_max" = 4, "train.batch_size" = 0.25}
[arms.pose]
set = {"model.position" = "rope", "train.position_transform" = "pose", "train.position_transform_options.target_length" = 16}
[arms.nope]
set = {"model.position" = "nope"}
[report]
summary = [1.0]
summary_metric = "perplexity"
figures = [{kind = "gain_by_sparsity", reference = "long", buckets = [2, 8], examples = 2}]
[scales.cpu]
"""


def toy_preset(folder) -> str:
    return f"""
method = "ntp"
[task]
name = "text"
train_min = 4
train_max = 4
options = {{source = "files", path = "{folder}"}}
[model]
d_model = 16
n_layer = 1
n_head = 2
[train]
steps = 30
batch_size = 16
log_interval = 10
checkpoint_interval = 30
device = "cpu"
[eval]
lengths = "4,16"
samples = 300
batch_size = 8
token_contexts = [4, 8, 16]
token_stride = 13
token_limit = 120
dependence_options = {{tau = 0.0, top_p = 20.0, epsilon = 0.2}}
"""


def independent_ratios(out, arm, seeds, edges, select="in_tau"):
    """G/D per bucket and seed from the CSV files, read with the csv module alone."""
    import csv

    per_seed = []
    for seed in range(seeds):
        with open(out / "runs" / f"text-long-s{seed}" / "dependence.csv") as f:
            dep = [r for r in csv.DictReader(f) if r[select] == "1"]
        with open(out / "runs" / f"text-{arm}-s{seed}" / "token_loss.csv") as f:
            short = {(r["document"], r["position"]): float(r["loss_4"]) - float(r["loss_16"]) for r in csv.DictReader(f)}
        sums = {}
        for r in dep:
            k = int(r["k"])
            b = 0 if k <= edges[0] else 1 if k <= edges[1] else 2
            g, d = sums.get(b, (0.0, 0.0))
            sums[b] = (g + short[(r["document"], r["position"])], d + float(r["delta"]))
        with open(out / "runs" / f"text-long-s{seed}" / "token_loss.csv") as f:
            ref = {(r["document"], r["position"]): float(r["loss_4"]) - float(r["loss_16"]) for r in csv.DictReader(f)}
        hurt = [key for key, d in ref.items() if d < 0.0]  # the mirror of T*: Δ < -tau (tau = 0 here)
        ratios = {b: g / d for b, (g, d) in sums.items()}
        ratios["mirror"] = sum(short[key] for key in hurt) / sum(ref[key] for key in hurt)
        per_seed.append(ratios)
    return per_seed


def test_the_reproduction_pairs_each_short_run_with_the_reference_of_its_seed_and_skips_finished_work(
        docs, tmp_path, monkeypatch):
    from lengthgen.reproduce import grid as grids
    from lengthgen.reproduce.runner import reproduce

    folder, _ = docs
    root = tmp_path / "experiments"
    (root / "toy" / "cpu").mkdir(parents=True)
    (root / "toy" / "grid.toml").write_text(TOY_GRID)
    (root / "toy" / "cpu" / "text.toml").write_text(toy_preset(folder))
    monkeypatch.setattr(grids, "ROOT", root)
    out = tmp_path / "out"
    report = reproduce("toy", "cpu", out=out, workers=1, threads=1, progress=False).read_text()
    assert "## Long-context gain by dependence sparsity" in report
    for name in ("gain_by_sparsity.png", "delta_distribution.png", "sparse_examples.png"):
        assert (out / name).stat().st_size > 5_000
    for seed in range(2):
        run = out / "runs" / f"text-long-s{seed}"
        cost = json.loads((run / "token_eval.json").read_text())
        assert cost["dependence"]["near"] == 4 and cost["dependence"]["full"] == 16
        assert cost["token_losses"]["passes"] == 3 * cost["token_losses"]["tokens"]
        assert not (out / "runs" / f"text-nope-s{seed}" / "dependence.csv").exists()  # only the reference searches
    # the table's cells: mean over seeds of the ratio computed here from the files alone
    for arm in ("pose", "nope"):
        per_seed = independent_ratios(out, arm, 2, [2, 8])
        line = next(l for l in report.splitlines() if l.startswith(f"| {arm} | 2 |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        for b in range(3):
            values = [s[b] for s in per_seed if b in s]
            if values:
                assert cells[2 + b].startswith(f"{np.mean(values):.3f}")
            else:
                assert cells[2 + b] == "–"
        assert cells[7].startswith(f"{np.mean([s['mirror'] for s in per_seed]):.3f}")
    # run again: every run is finished and evaluated, nothing is computed again
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("token_loss.csv")}
    reproduce("toy", "cpu", out=out, workers=1, threads=1, progress=False)
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("token_loss.csv")}
    # a lost dependence.csv: that run alone is evaluated again
    (out / "runs" / "text-long-s1" / "dependence.csv").unlink()
    reproduce("toy", "cpu", out=out, workers=1, threads=1, progress=False)
    assert (out / "runs" / "text-long-s1" / "dependence.csv").is_file()
    changed = [p for p, t in stamps.items() if p.stat().st_mtime_ns != t]
    assert [p.parent.name for p in changed] == ["text-long-s1"]
    # evaluating other windows later does not pay for the per-token files again
    from lengthgen.evaluation.evaluate import evaluate_run

    run = out / "runs" / "text-long-s0"
    before = (run / "token_loss.csv").stat().st_mtime_ns, (run / "dependence.csv").stat().st_mtime_ns
    evaluate_run(run, [8], 100, progress=False)
    assert before == ((run / "token_loss.csv").stat().st_mtime_ns, (run / "dependence.csv").stat().st_mtime_ns)
    # k again with leave-one-out ranks, on a few tokens of the reference's T* (scripts/dependence_ranks.py)
    import subprocess

    from lengthgen.cli import main
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "dependence_ranks.py"
    loo = tmp_path / "loo"
    for seed in range(2):
        done = subprocess.run([sys.executable, str(script), str(out / "runs" / f"text-long-s{seed}"), "3", "--out",
                               str(loo)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "3 tokens of T*" in done.stdout and "| leave_one_out |" in done.stdout and "| attention |" in done.stdout
    # ... and writes a reference the report reads: the short runs against it, and the original reference
    # against its re-ranked copy, whose G/Δ is exactly 1 in every bucket (the same losses on both sides)
    assert main(["report", str(out / "runs"), str(loo), "--out", str(tmp_path / "loo-report"),
                 "--gain-reference", "long_loo"]) == 0
    text = (tmp_path / "loo-report" / "report.md").read_text()
    line = next(l for l in text.splitlines() if l.startswith("| long | 2 |"))
    assert all(c.strip().startswith("1.000") or c.strip() == "–" for c in line.strip("|").split("|")[2:6])
    refused = subprocess.run([sys.executable, str(script), str(out / "runs" / "text-nope-s0")], capture_output=True,
                             text=True)
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1 and "dependence.csv" in refused.stderr
    # the same comparison outside a grid: lengthgen report --gain-reference

    assert main(["report", str(out / "runs"), "--out", str(tmp_path / "again"), "--gain-reference", "long"]) == 0
    assert "Long-context gain by dependence sparsity" in (tmp_path / "again" / "report.md").read_text()
    assert main(["report", str(out / "runs"), "--out", str(tmp_path / "bad"), "--gain-reference", "longer"]) == 2


def test_the_sparsity_lm_grid_is_listed_and_plans_the_reference_at_four_times_the_window(tmp_path):
    from lengthgen.reproduce import grid as grids
    from lengthgen.tasks.corpus import CorpusError

    assert "sparsity-lm" in grids.papers()
    assert "sparsity-lm: Sparse dependence in natural language" in grids.describe()
    grid = grids.find("sparsity-lm")
    assert set(grid.scales) == {"cpu", "paper"} and "c4" in grid.resolved("paper")["tasks"]
    try:
        jobs = grids.plan(grid, "cpu", ["text"], grid.defaults("cpu", "arms"), 3, tmp_path, 1, threads=1)
    except Exception as err:  # the Python documentation is not installed here
        if isinstance(err, CorpusError) or "python3-doc" in str(err):
            pytest.skip("no python-docs corpus")
        raise
    assert len(jobs) == 12
    configs = {(j.arm, j.seed): presets.load(j.preset, j.overrides) for j in jobs}
    short = configs[("rope_pose", 0)]
    long = configs[("long", 0)]
    L = short.task.train_max
    assert long.task.train_max == 4 * L and long.train.batch_size * 4 == short.train.batch_size  # same tokens
    assert short.train.position_transform_options["target_length"] == 4 * L
    assert long.eval.dependence and not short.eval.dependence
    assert short.eval.token_contexts == long.eval.token_contexts == [L, 2 * L, 4 * L]
    assert configs[("nope", 2)].model.position == "nope" and configs[("rope", 1)].train.position_transform == "none"


def test_the_paper_presets_load_on_local_copies_with_the_seeds_optimiser(tmp_path, monkeypatch):
    """WikiText-103 and C4 at paper scale, read from local copies in the hub's layout: the seed's
    AdamW lr 5e-5, weight decay 0.1, linear schedule with 300 warm-up steps; contexts L, 2L, 4L."""
    pytest.importorskip("datasets")
    pytest.importorskip("tokenizers")
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "model", "token", "length", "window"]
    wiki = tmp_path / "wikitext" / "wikitext-103-raw-v1"
    wiki.mkdir(parents=True)
    c4 = tmp_path / "c4" / "en"
    c4.mkdir(parents=True)
    for split in ("train", "validation", "test"):
        lines = [f" = {split} {i} = \n" if j == 0 else " ".join(rng.choice(words, 30)) + " \n"
                 for i in range(6) for j in range(4)]
        pq.write_table(pa.table({"text": lines}), wiki / f"{split}-00000-of-00001.parquet")
    for split in ("train", "validation"):
        with gzip.open(c4 / f"c4-{split}.00000-of-00001.json.gz", "wt") as f:
            for _ in range(30):
                f.write(json.dumps({"text": " ".join(rng.choice(words, 40))}) + "\n")
    for name, path in (("text", tmp_path / "wikitext"), ("c4", tmp_path / "c4")):
        cfg = presets.load(f"experiments/sparsity-lm/paper/{name}.toml",
                           [f"task.options.path={path}", "task.options.vocab_size=600"])
        tr = cfg.train
        assert (tr.lr, tr.weight_decay, tr.schedule, tr.warmup_steps) == (5e-5, 0.1, "linear", 300)
        L = cfg.task.train_max
        assert cfg.eval.token_contexts == [L, 2 * L, 4 * L] and cfg.model.position == "rope"
        assert cfg.task.options["source"] == {"text": "wikitext-103", "c4": "c4"}[name]
