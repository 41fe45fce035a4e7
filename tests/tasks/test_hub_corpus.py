"""The C4 loader on a local copy in the hub's layout (no download at test time)."""
from __future__ import annotations

import gzip
import json

import pytest

from lengthgen.tasks.corpus import Corpus, c4_split_of

from tests.helpers.documents import docs, lm_overrides, write_documents  # noqa: F401  (docs is a fixture)


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
