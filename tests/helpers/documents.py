"""A small local corpus of text files for the language-model tests (no download), and the
overrides of a tiny language-model run on it."""
from __future__ import annotations

import random

import pytest

WORDS = "the of a model window token attention position length query key value layer head".split()


def write_documents(folder, count=60, seed=0, words=200):
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    texts = {}
    for i in range(count):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(words // 2, words))) + "\n"
        name = f"part{i % 3}/doc{i:03d}.txt"
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text)
        texts[name] = text
    return texts


@pytest.fixture
def docs(tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path / "cache"))
    folder = tmp_path / "docs"
    return folder, write_documents(folder)


def lm_overrides(folder, *extra):
    return [f"task.options.path={folder}", "task.options.source=files", "task.train_min=16", "task.train_max=16",
            "model.d_model=32", "model.n_layer=1", "model.n_head=2", "train.steps=150", "train.batch_size=16",
            "optim.warmup_steps=10", "train.log_interval=50", "train.checkpoint_interval=150",
            "eval.lengths=16,64", "eval.samples=600", "eval.batch_size=4", *extra]
