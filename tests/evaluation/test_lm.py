"""Language modelling: the corpus loader, its splits and token files, the windows of the
perplexity evaluation, perplexity itself, the BPE tokenizer, the WikiText loader, a run that
learns, and the report's perplexity summary and figures."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lengthgen.cli import main
from lengthgen.assembly.runs import new_run_config
from lengthgen.evaluation.evaluate import evaluate_run
from lengthgen.evaluation.language_model import perplexity_at, split_windows
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.results.rows import read_position_loss, read_rows
from lengthgen.methods.base import Method
from lengthgen.reporting.report import write_report
from lengthgen.tasks import EOS, IGNORE, get_task
from lengthgen.tasks.corpus import Corpus, CorpusError, split_of, wikitext_articles
from lengthgen.training.trainer import train

from tests.helpers.documents import docs, lm_overrides, write_documents  # noqa: F401  (docs is a fixture)


def test_splits_are_disjoint_deterministic_and_stable(docs, tmp_path):
    folder, texts = docs
    corpus = Corpus("files", str(folder))
    names = {split: [n for n, _ in corpus.documents(split)] for split in ("train", "validation", "test")}
    assert sorted(sum(names.values(), [])) == sorted(texts)  # every document in exactly one split
    assert all(names[s] for s in names)  # 60 documents: each split gets some
    assert names == {s: [n for n, _ in Corpus("files", str(folder)).documents(s)] for s in names}
    # the rule is the document's own hash: another document does not move it
    (folder / "extra.txt").write_text("one more document\n")
    moved = {s: [n for n, _ in Corpus("files", str(folder)).documents(s) if n != "extra.txt"] for s in names}
    assert moved == names
    assert split_of("part0/doc000.txt") == split_of("part0/doc000.txt")


def test_token_files_hold_every_document_once_in_name_order(docs):
    folder, texts = docs
    corpus = Corpus("files", str(folder))
    for split in ("train", "validation", "test"):
        expected = []
        for name in sorted(n for n in texts if split_of(n) == split):
            expected += [b + 3 for b in texts[name].encode()] + [EOS]
        assert corpus.tokens(split).tolist() == expected
        assert corpus.meta()["splits"][split]["tokens"] == len(expected)
    assert corpus.decode(corpus.tokens("test")[:20]) == "".join(texts[n] for n in sorted(texts)
                                                                if split_of(n) == "test")[:20]


def test_a_changed_document_rebuilds_the_token_files(docs):
    folder, texts = docs
    before = Corpus("files", str(folder)).tokens_folder()
    name = next(iter(texts))
    (folder / name).write_text(texts[name] + "changed\n")
    assert Corpus("files", str(folder)).tokens_folder() != before


@pytest.mark.parametrize("window", [1, 7, 16, 100])
def test_windows_score_every_test_token_once(docs, window):
    folder, _ = docs
    task = get_task("text", source="files", path=str(folder))
    stream = task.corpus.tokens("test")
    tokens = 333  # not a multiple of the window: the last window is shorter
    seen = []
    for batch in split_windows(task, window, tokens, batch_windows=3):
        assert batch.inputs.shape[1] == window
        for row in range(len(batch)):
            scored = (batch.targets[row] != IGNORE).nonzero().flatten()
            seen += batch.targets[row][scored].tolist()
            # the inputs are the tokens just before their targets
            assert batch.inputs[row][scored].tolist() == [int(stream[i]) for i in
                                                          range(len(seen) - len(scored), len(seen))]
    assert seen == [int(t) for t in stream[1:tokens + 1]]  # each of tokens 1..N once, in order


class Unigram(Method):
    """Predicts the unigram distribution `p` at every position, whatever the context."""

    def __init__(self, p):
        self.logp = torch.log(p)

    def logits(self, model, batch):
        return self.logp.expand(*batch.inputs.shape, -1)


@pytest.mark.parametrize("window", [5, 64])
def test_perplexity_of_the_unigram_model_is_the_unigram_entropy(docs, window):
    folder, _ = docs
    task = get_task("text", source="files", path=str(folder))
    scored = torch.from_numpy(task.corpus.tokens("test")[1:].astype(np.int64))
    counts = torch.bincount(scored, minlength=task.vocab_size).double()
    p = counts / counts.sum()
    entropy = -float((p[p > 0] * p[p > 0].log()).sum())
    values, per_position = perplexity_at(task, Unigram(p.float().clamp(min=1e-30)), None, window, 0, 1000,
                                         torch.device("cpu"))
    assert values["tokens"] == len(scored)
    assert values["loss"] == pytest.approx(entropy, rel=1e-5)
    assert values["perplexity"] == pytest.approx(math.exp(entropy), rel=1e-5)
    assert per_position.shape == (window,)


def test_bad_corpus_options_are_one_line_errors(docs, tmp_path):
    folder, _ = docs
    for options, message in [({"source": "web"}, "unknown corpus source"), ({"tokenizer": "chars"}, "unknown tokenizer"),
                              ({"source": "files"}, "needs path"), ({"vocab_size": 1000}, "applies to tokenizer 'bpe'"),
                              ({"tokenizer": "bpe"}, "needs vocab_size")]:
        with pytest.raises(ValueError, match=message):
            get_task("text", **options)
    with pytest.raises(CorpusError, match="does not exist"):
        Corpus("files", str(tmp_path / "nowhere")).tokens("train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="holds no"):
        Corpus("files", str(tmp_path / "empty")).tokens("train")


def test_missing_python_docs_name_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path))
    monkeypatch.setattr("lengthgen.tasks.corpus.DOCS_GLOB", str(tmp_path / "none" / "*"))
    with pytest.raises(CorpusError, match="python3-doc"):
        Corpus().tokens("train")


@pytest.mark.slow
def test_a_tiny_language_model_learns_and_is_evaluated_and_reported(docs, tmp_path):
    folder, texts = docs
    cfg = new_run_config("experiments/lm/cpu/text.toml", lm_overrides(folder))
    runs = tmp_path / "runs"
    for position in ("rope", "tra"):
        for seed in (0, 1):
            run = new_run_config("experiments/lm/cpu/text.toml", lm_overrides(
                folder, f"model.position={position}", f"train.model_seed={seed}", f"data.seed={seed}"))
            train(run, runs / f"{position}-s{seed}", progress=False)
            (runs / f"{position}-s{seed}" / "series.json").write_text(f'{{"arm": "{position}"}}')
            evaluate_run(runs / f"{position}-s{seed}", EvalSettings(lengths=[16, 64], samples=600, progress=False))
    rows = read_rows(runs / "rope-s0" / "eval.csv")
    assert [r["length"] for r in rows] == [16, 64] and all(r["n"] == 600 for r in rows)
    # a model of 150 steps must beat the unigram model of the training text by a margin
    task = get_task("text", source="files", path=str(folder))
    counts = np.bincount(task.corpus.tokens("train"), minlength=task.vocab_size).astype(float)
    p = counts / counts.sum()
    unigram = math.exp(-(p[p > 0] * np.log(p[p > 0])).sum())
    assert rows[0]["perplexity"] < 0.8 * unigram
    assert rows[0]["perplexity"] == pytest.approx(math.exp(rows[0]["loss"]))
    losses = read_position_loss(runs / "rope-s0" / "position_loss.csv")
    assert sorted({(r["window"]) for r in losses}) == [16, 64]
    assert [r["position"] for r in losses if r["window"] == 64] == list(range(64))
    # context helps: the later positions of the training window beat the first one
    first = [r["loss"] for r in losses if r["window"] == 16 and r["position"] == 0][0]
    late = np.mean([r["loss"] for r in losses if r["window"] == 16 and r["position"] >= 8])
    assert late < first
    report = write_report([runs], tmp_path / "report", layout={
        "summary": [1.0, 4.0], "summary_metric": "perplexity",
        "figures": [{"kind": "accuracy_vs_length", "metric": "perplexity", "log": True},
                    {"kind": "position_loss", "windows": [16, 64]}, "training_curves"]}).read_text()
    assert "ratio 4× / 1×" in report and "Next-token accuracy" in report
    for name in ("perplexity_vs_length.png", "position_loss.png", "training_curves.png"):
        assert (tmp_path / "report" / name).stat().st_size > 10_000
    rope = [r for r in read_rows(runs / "rope-s0" / "eval.csv")] + [r for r in read_rows(runs / "rope-s1" / "eval.csv")]
    ratio = (np.mean([r["perplexity"] for r in rope if r["length"] == 64])
             / np.mean([r["perplexity"] for r in rope if r["length"] == 16]))
    assert "| text | rope |" in report and f"{ratio:.3f}" in report


def test_bpe_tokenizer_is_trained_on_the_training_split_and_saved_in_the_run(docs, tmp_path):
    pytest.importorskip("tokenizers")
    folder, texts = docs
    task = get_task("text", source="files", path=str(folder), tokenizer="bpe", vocab_size=600)
    bpe = task.corpus.bpe()
    assert bpe.get_vocab_size() <= 600 and bpe.token_to_id("<eos>") == EOS
    text = texts[sorted(texts)[0]]
    assert task.corpus.decode(bpe.encode(text).ids) == text
    assert task.corpus.tokens("train").max() < 600
    assert len(task.corpus.tokens("train")) < 0.6 * sum(len(t) for n, t in texts.items() if split_of(n) == "train")
    cfg = new_run_config("experiments/lm/cpu/text.toml", lm_overrides(folder, "task.options.tokenizer=bpe",
                                                                      "task.options.vocab_size=600", "train.steps=2"))
    train(cfg, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "tokenizer.json").read_bytes() == (task.corpus.ensure() / "tokenizer.json").read_bytes()


def test_wikitext_articles_split_at_top_level_headings():
    lines = [" = Alpha = \n", " text of alpha \n", " = = Section = = \n", " more alpha \n",
             " = Beta = \n", " text of beta \n", "\n"]
    assert wikitext_articles(lines) == ["".join(lines[:4]), "".join(lines[4:])]


def test_wikitext_loads_a_local_copy_in_the_hub_layout(tmp_path, monkeypatch):
    pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    lines = {}
    for split in ("train", "validation", "test"):
        lines[split] = [f" = {split} {i} = \n" if j == 0 else f" words {split} {i} {j} \n"
                        for i in range(4) for j in range(3)]
        folder = tmp_path / "wikitext" / "wikitext-103-raw-v1"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": lines[split]}), folder / f"{split}-00000-of-00001.parquet")
    corpus = Corpus("wikitext-103", str(tmp_path / "wikitext"))
    test = corpus.documents("test")
    assert [text for _, text in test] == ["".join(lines["test"][i:i + 3]) for i in range(0, 12, 3)]
    stream = corpus.tokens("validation")
    assert corpus.decode(stream[:len(lines["validation"][0])]) == lines["validation"][0]


def test_train_refuses_a_text_preset_without_its_corpus(tmp_path, capsys):
    code = main(["train", "experiments/lm/cpu/text.toml", "--set", f"task.options.path={tmp_path / 'none'}",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "does not exist" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_python_docs_are_the_newest_version_with_links_resolved(monkeypatch, tmp_path):
    from lengthgen.tasks.corpus import python_docs_folder

    for version in ("3.9", "3.12", "3.10"):
        (tmp_path / f"python{version}" / "html" / "_sources").mkdir(parents=True)
    (tmp_path / "python3.12-doc").mkdir()
    (tmp_path / "python3.12-doc" / "html").symlink_to(tmp_path / "python3.12" / "html")
    monkeypatch.setattr("lengthgen.tasks.corpus.DOCS_GLOB", str(tmp_path / "python3.*" / "html" / "_sources"))
    assert python_docs_folder() == (tmp_path / "python3.12" / "html" / "_sources").resolve()
