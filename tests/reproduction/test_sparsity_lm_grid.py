"""`lengthgen reproduce sparsity-lm` on a toy grid: each short run paired with the reference run
of its seed, finished work skipped, the paper presets loading on local copies."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from lengthgen.assembly.runs import new_run_config

from tests.helpers.documents import docs, lm_overrides, write_documents  # noqa: F401  (docs is a fixture)
from tests.helpers.in_process import run_all_here, run_python_file


TOY_GRID = """
title = "Sparse dependence, toy"
seeds = 2
[tasks.text]
[arms.long]
set = {"model.position" = "rope", "eval.dependence" = true}
multiply = {"task.train_min" = 4, "task.train_max" = 4, "train.batch_size" = 0.25}
[arms.pose]
set = {"model.position" = "rope", "data.position_transform" = "pose", "data.position_transform_options.target_length" = 16}
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


@pytest.mark.slow  # trains and evaluates a grid of language models
def test_the_reproduction_pairs_each_short_run_with_the_reference_of_its_seed_and_skips_finished_work(
        docs, tmp_path, monkeypatch):
    from lengthgen.reproduction import grid as grids
    from lengthgen.reproduction import runner
    from lengthgen.reproduction.request import ReproduceRequest
    from lengthgen.reproduction.runner import reproduce

    monkeypatch.setattr(runner, "run_all", run_all_here)
    folder, _ = docs
    root = tmp_path / "experiments"
    (root / "toy" / "cpu").mkdir(parents=True)
    (root / "toy" / "grid.toml").write_text(TOY_GRID)
    (root / "toy" / "cpu" / "text.toml").write_text(toy_preset(folder))
    monkeypatch.setattr(grids, "ROOT", root)
    out = tmp_path / "out"
    report = reproduce("toy", ReproduceRequest(scale="cpu", out=out, workers=1, threads=1, progress=False)).read_text()
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
    reproduce("toy", ReproduceRequest(scale="cpu", out=out, workers=1, threads=1, progress=False))
    assert stamps == {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("token_loss.csv")}
    # a lost dependence.csv: that run alone is evaluated again
    (out / "runs" / "text-long-s1" / "dependence.csv").unlink()
    reproduce("toy", ReproduceRequest(scale="cpu", out=out, workers=1, threads=1, progress=False))
    assert (out / "runs" / "text-long-s1" / "dependence.csv").is_file()
    changed = [p for p, t in stamps.items() if p.stat().st_mtime_ns != t]
    assert [p.parent.name for p in changed] == ["text-long-s1"]
    # evaluating other windows later does not pay for the per-token files again
    from lengthgen.evaluation.evaluate import evaluate_run
    from lengthgen.evaluation.settings import EvalSettings

    run = out / "runs" / "text-long-s0"
    before = (run / "token_loss.csv").stat().st_mtime_ns, (run / "dependence.csv").stat().st_mtime_ns
    evaluate_run(run, EvalSettings(lengths=[8], samples=100, progress=False))
    assert before == ((run / "token_loss.csv").stat().st_mtime_ns, (run / "dependence.csv").stat().st_mtime_ns)
    # k again with leave-one-out ranks, on a few tokens of the reference's T* (scripts/dependence_ranks.py)
    from lengthgen.cli import main
    from pathlib import Path


    script = Path(__file__).resolve().parents[2] / "scripts" / "dependence_ranks.py"
    loo = tmp_path / "loo"
    for seed in range(2):
        done = run_python_file(script, str(out / "runs" / f"text-long-s{seed}"), "3", "--out", str(loo))
        assert done.returncode == 0, done.stderr
        assert "3 tokens of T*" in done.stdout and "| leave_one_out |" in done.stdout and "| attention |" in done.stdout
    # ... and writes a reference the report reads: the short runs against it, and the original reference
    # against its re-ranked copy, whose G/Δ is exactly 1 in every bucket (the same losses on both sides)
    assert main(["report", str(out / "runs"), str(loo), "--out", str(tmp_path / "loo-report"),
                 "--gain-reference", "long_loo"]) == 0
    text = (tmp_path / "loo-report" / "report.md").read_text()
    line = next(l for l in text.splitlines() if l.startswith("| long | 2 |"))
    assert all(c.strip().startswith("1.000") or c.strip() == "–" for c in line.strip("|").split("|")[2:6])
    refused = run_python_file(script, str(out / "runs" / "text-nope-s0"))
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1 and "dependence.csv" in refused.stderr
    # the same comparison outside a grid: lengthgen report --gain-reference

    assert main(["report", str(out / "runs"), "--out", str(tmp_path / "again"), "--gain-reference", "long"]) == 0
    assert "Long-context gain by dependence sparsity" in (tmp_path / "again" / "report.md").read_text()
    assert main(["report", str(out / "runs"), "--out", str(tmp_path / "bad"), "--gain-reference", "longer"]) == 2


def test_the_sparsity_lm_grid_is_listed_and_plans_the_reference_at_four_times_the_window(tmp_path):
    from lengthgen.reproduction import grid as grids
    from lengthgen.reproduction import planning
    from lengthgen.reproduction.request import ReproduceRequest
    from lengthgen.tasks.corpus import CorpusError

    assert "sparsity-lm" in grids.papers()
    assert "sparsity-lm: Sparse dependence in natural language" in grids.describe()
    grid = grids.find("sparsity-lm")
    assert set(grid.scales) == {"cpu", "paper"} and "c4" in grid.resolved("paper")["tasks"]
    try:
        jobs = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["text"], arms=grid.defaults("cpu", "arms"),
                                                 seeds=3, out=tmp_path, workers=1, threads=1))
    except Exception as err:  # the Python documentation is not installed here
        if isinstance(err, CorpusError) or "python3-doc" in str(err):
            pytest.skip("no python-docs corpus")
        raise
    assert len(jobs) == 12
    configs = {(j.arm, j.seed): new_run_config(j.preset, j.overrides) for j in jobs}
    short = configs[("rope_pose", 0)]
    long = configs[("long", 0)]
    L = short.task.train_max
    assert long.task.train_max == 4 * L and long.train.batch_size * 4 == short.train.batch_size  # same tokens
    assert short.data.position_transform_options["target_length"] == 4 * L
    assert long.eval.dependence and not short.eval.dependence
    assert short.eval.token_contexts == long.eval.token_contexts == [L, 2 * L, 4 * L]
    assert configs[("nope", 2)].model.position == "nope" and configs[("rope", 1)].data.position_transform == "none"


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
        cfg = new_run_config(f"experiments/sparsity-lm/paper/{name}.toml",
                             [f"task.options.path={path}", "task.options.vocab_size=600"])
        op = cfg.optim
        assert (op.lr, op.weight_decay, op.schedule, op.warmup_steps) == (5e-5, 0.1, "linear", 300)
        L = cfg.task.train_max
        assert cfg.eval.token_contexts == [L, 2 * L, 4 * L] and cfg.model.position == "rope"
        assert cfg.task.options["source"] == {"text": "wikitext-103", "c4": "c4"}[name]
