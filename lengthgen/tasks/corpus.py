"""Text corpora for language modelling: documents -> splits -> token files on disk.

A corpus is a list of documents (name, text). Each split (train, validation,
test) is one token stream: its documents in name order, each followed by EOS,
tokenized once and written to `<cache>/corpora/<corpus key>/<tokenizer>/<split>.bin`
(uint16, or uint32 for vocabularies past 65,536), then read through
`numpy.memmap`, so training draws windows without holding the corpus in memory.

Sources (`source`, with `path` to point at a local copy):
- `python-docs` (the default): the reStructuredText sources of the Python
  documentation, as Debian's `python3-doc` package installs them
  (/usr/share/doc/python3.X/html/_sources, `make corpus`); `path` may name any
  folder of `*.rst` / `*.rst.txt` files, e.g. a CPython checkout's `Doc/`.
- `files`: every `*.txt`, `*.rst` and `*.md` file under `path`, one document each.
  Both split by a fixed rule on the document's path: the first two bytes of its
  SHA-256, read as a number mod 100, below 90 -> train, below 95 -> validation,
  else test. A document keeps its split when others are added or removed.
- `wikitext-103`: WikiText-103 (raw) through Hugging Face `datasets`
  (`pip install 'lengthgen[lm]'`, needs internet once), or `path` = a folder in the
  hub's layout (`wikitext-103-raw-v1/{train,validation,test}-*.parquet`); its own
  splits; an article starts at each top-level heading line ` = Title = `.
- `c4`: C4 (`allenai/c4`, config `en`, Raffel et al. 2020) streamed through `datasets`, or
  `path` = a folder in the hub's layout (`en/c4-{train,validation}.*.json.gz`). C4 has no
  test split: its train split is ours, and its validation documents go to our validation
  or test split by a fixed rule on their index (`c4_split_of`), half each.
`max_documents` (any source) keeps the first that many documents of each split (0 = all):
C4's 365 M training documents are streamed only as far as that.

Tokenizers: `bytes` (UTF-8 bytes, id = byte + 3 after the three specials; no
vocabulary to download) or `bpe` (byte-level BPE of `vocab_size` tokens trained
on the training split with the `tokenizers` library; saved beside the token
files and copied into each run folder as tokenizer.json).
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import itertools
import json
import os
import re
import sys
from pathlib import Path

import numpy as np

from lengthgen.errors import path_problem

from .base import EOS, MAX_VOCAB, SPECIALS

SPLITS = ("train", "validation", "test")
SOURCES = ("python-docs", "files", "wikitext-103", "c4")
TOKENIZERS = ("bytes", "bpe")
SUFFIXES = {"python-docs": (".rst", ".rst.txt"), "files": (".txt", ".rst", ".md")}
DOCS_GLOB = "/usr/share/doc/python3.*/html/_sources"
WIKITEXT_HUB = "Salesforce/wikitext"
WIKITEXT_DIR = "wikitext-103-raw-v1"
C4_HUB, C4_CONFIG = "allenai/c4", "en"
FORMAT = 2  # bump when the token files' layout changes: old caches are then rebuilt (2: sizes and digests)


class CorpusError(ValueError):
    """A corpus that cannot be found or read; the message says how to get it."""


def cache_root() -> Path:
    """$LENGTHGEN_DATA, else $XDG_CACHE_HOME/lengthgen, else ~/.cache/lengthgen."""
    if os.environ.get("LENGTHGEN_DATA"):
        return Path(os.environ["LENGTHGEN_DATA"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lengthgen"


def python_docs_folder() -> Path:
    """The newest installed Python documentation sources, or a CorpusError saying how to install them."""
    # python3.11-doc/html and python3.11-dev are links to python3.11/html: one folder, one corpus key
    found = sorted({Path(p).resolve() for p in glob.glob(DOCS_GLOB)},
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.parts[-3])])
    if not found:
        raise CorpusError("the python-docs corpus needs Debian's python3-doc package (`make corpus`, or "
                          "`apt-get install python3-doc`), or task.options.path = a folder of .rst files")
    return Path(found[-1])


def split_of(name: str) -> str:
    """The split of a document named `name` (its path in the corpus): a fixed hash rule."""
    bucket = int.from_bytes(hashlib.sha256(name.encode()).digest()[:2], "big") % 100
    return "train" if bucket < 90 else "validation" if bucket < 95 else "test"


def folder_documents(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Every file under `folder` whose name ends in one of `suffixes`, in name order."""
    if not folder.is_dir():
        raise CorpusError(f"corpus folder {folder} {path_problem(folder, 'folder')}")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(suffixes))
    if not files:
        raise CorpusError(f"corpus folder {folder} holds no {' / '.join(suffixes)} files")
    return files


def wikitext_articles(lines) -> list[str]:
    """WikiText lines (one paragraph or heading each) -> articles, split at top-level headings
    ` = Title = ` (second-level headings ` = = Section = = ` stay inside their article)."""
    articles, current = [], []
    for line in lines:
        if re.fullmatch(r" = [^=].* = \n?", line) and current:
            articles.append("".join(current))
            current = []
        current.append(line if line.endswith("\n") else line + "\n")
    if current:
        articles.append("".join(current))
    return [a for a in articles if a.strip()]


def wikitext_split(split: str, path: str = ""):
    """The lines of one WikiText-103 split through Hugging Face datasets (hub or local copy)."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise CorpusError("the wikitext-103 corpus needs Hugging Face datasets: pip install 'lengthgen[lm]'") from None
    where = path or WIKITEXT_HUB
    return load_dataset(where, data_dir=WIKITEXT_DIR, split=split)["text"]


def c4_split_of(index: int) -> str:
    """Our split of the C4 validation document at `index`: the first two bytes of the SHA-256 of
    the index, mod 100, below 50 -> validation, else test (fixed, like `split_of`)."""
    bucket = int.from_bytes(hashlib.sha256(f"c4-validation/{index}".encode()).digest()[:2], "big") % 100
    return "validation" if bucket < 50 else "test"


def c4_texts(split: str, path: str = ""):
    """The texts of one C4 split (train or validation), streamed from the hub or a local copy."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise CorpusError("the c4 corpus needs Hugging Face datasets: pip install 'lengthgen[lm]'") from None
    if not path:
        return (r["text"] for r in load_dataset(C4_HUB, C4_CONFIG, split=split, streaming=True))
    files = sorted(glob.glob(str(Path(path).expanduser() / C4_CONFIG / f"c4-{split}.*.json.gz")))
    if not files:
        raise CorpusError(f"corpus folder {path} holds no {C4_CONFIG}/c4-{split}.*.json.gz files (the hub's layout)")
    return (r["text"] for r in load_dataset("json", data_files={split: files}, split=split, streaming=True))


HUB_SOURCES = ("wikitext-103", "c4")  # read through Hugging Face datasets
CHECKED: set[Path] = set()  # token folders this process has checked (once each)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_damage(folder: Path) -> str | None:
    """What is wrong with a token folder (missing, or a file whose size or digest differs from
    what meta.json recorded when it was built), naming the file, or None."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        return f"{folder} holds no token files yet"
    try:
        meta = json.loads(meta_path.read_text())
        files, splits = meta["files"], meta["splits"]
        if meta["format"] != FORMAT or set(splits) != set(SPLITS):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError):  # damaged, or written by an earlier version
        return f"{meta_path} is damaged or of an earlier version"
    for name in [f"{split}.bin" for split in SPLITS] + (["tokenizer.json"] if meta.get("tokenizer") == "bpe" else []):
        path, recorded = folder / name, files.get(name, {})
        if not path.is_file():
            return f"{path} is missing"
        size, written = path.stat().st_size, recorded.get("bytes")
        if size != written:
            written = f"{written:,}" if isinstance(written, int) else "none"
            return f"{path} holds {size:,} bytes where {written} were written (truncated?)"
        if file_digest(path) != recorded.get("sha256"):
            return f"{path} differs from the file written (its sha256 changed)"
    return None


class Corpus:
    """Documents of one source, split, tokenized once into memory-mapped token files."""

    def __init__(self, source: str = "python-docs", path: str = "", tokenizer: str = "bytes", vocab_size: int = 0,
                 max_documents: int = 0):
        if source not in SOURCES:
            raise ValueError(f"unknown corpus source {source!r}; choose from {', '.join(SOURCES)}")
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; choose from {', '.join(TOKENIZERS)}")
        if not isinstance(path, str):
            raise ValueError(f"path must be a string, got {path!r}")
        if source == "files" and not path:
            raise ValueError("source 'files' needs path = a folder of .txt / .rst / .md files")
        if tokenizer == "bytes" and vocab_size:
            raise ValueError("vocab_size applies to tokenizer 'bpe' (bytes has 256 + 3 tokens)")
        if tokenizer == "bpe" and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or not 512 <= vocab_size <= MAX_VOCAB):
            raise ValueError(f"tokenizer 'bpe' needs vocab_size, an integer in [512, {MAX_VOCAB}], got {vocab_size!r}")
        if isinstance(max_documents, bool) or not isinstance(max_documents, int) or max_documents < 0:
            raise ValueError(f"max_documents must be an integer >= 0 (0 = all), got {max_documents!r}")
        self.source, self.path, self.tokenizer, self.vocab_size_asked = source, path, tokenizer, vocab_size
        self.max_documents = max_documents
        self._memmaps: dict[str, np.memmap] = {}

    # -- documents -----------------------------------------------------------------------
    def folder(self) -> Path:
        return Path(self.path).expanduser().resolve() if self.path else python_docs_folder()

    def documents(self, split: str) -> list[tuple[str, str]]:
        """(name, text) of every document of `split`, in name order (the first max_documents)."""
        if self.source not in HUB_SOURCES:
            return self.local_documents(split)
        try:
            return self.hub_documents(split)
        except CorpusError:
            raise
        except Exception as err:  # the hub unreachable or a local copy unreadable: one line, not a traceback
            where = f"the local copy {self.path}" if self.path else "the Hugging Face hub"
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise CorpusError(f"could not read the {self.source} corpus ({split}) from {where}: {first}; "
                              "run once with network access, or set task.options.path to a local copy in the "
                              "hub's layout") from None

    def hub_documents(self, split: str) -> list[tuple[str, str]]:
        cap = self.max_documents or None
        if self.source == "wikitext-103":
            return [(f"{split}/{i:06d}", text) for i, text in enumerate(wikitext_articles(wikitext_split(split, self.path)))][:cap]
        if self.source == "c4":
            if split == "train":
                return [(f"train/{i:09d}", t) for i, t in enumerate(itertools.islice(c4_texts("train", self.path), cap))]
            mine = ((f"validation/{i:09d}", t) for i, t in enumerate(c4_texts("validation", self.path))
                    if c4_split_of(i) == split)
            return list(itertools.islice(mine, cap))
        raise CorpusError(f"{self.source} is not a corpus of the hub")

    def local_documents(self, split: str) -> list[tuple[str, str]]:
        cap = self.max_documents or None
        root = self.folder()
        docs = []
        for file in folder_documents(root, SUFFIXES[self.source]):
            name = file.relative_to(root).as_posix()
            if split_of(name) == split:
                docs.append((name, file.read_text(encoding="utf-8", errors="replace")))
        return docs[:cap]

    def key(self) -> str:
        """A folder name that changes when the documents would: the source, its folder and the
        name, size and mtime of every file in it (WikiText: the hub name or folder)."""
        if self.source in ("wikitext-103", "c4"):
            hub = WIKITEXT_HUB if self.source == "wikitext-103" else f"{C4_HUB}/{C4_CONFIG}"
            ident = [self.source, str(Path(self.path).resolve()) if self.path else hub]
        else:
            root = self.folder()
            ident = [self.source, str(root)] + [f"{p.relative_to(root)}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
                                                for p in folder_documents(root, SUFFIXES[self.source])]
        if self.max_documents:  # only when set: the caches of corpora read whole keep their names
            ident.append(f"max_documents={self.max_documents}")
        return f"{self.source}-{hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:12]}"

    def tokens_folder(self) -> Path:
        name = "bytes" if self.tokenizer == "bytes" else f"bpe-{self.vocab_size_asked}"
        return cache_root() / "corpora" / self.key() / name

    # -- tokenizers ------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + 256 if self.tokenizer == "bytes" else self.vocab_size_asked

    def encode_many(self, texts: list[str], bpe=None) -> list[np.ndarray]:
        if self.tokenizer == "bytes":
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.uint32) + len(SPECIALS) for t in texts]
        return [np.asarray(e.ids, dtype=np.uint32) for e in bpe.encode_batch(texts)]

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.tokenizer == "bytes":
            return bytes(i - len(SPECIALS) for i in ids if i >= len(SPECIALS)).decode("utf-8", errors="replace")
        return self.bpe().decode(ids)

    def bpe(self):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.ensure() / "tokenizer.json"))

    def train_bpe(self, folder: Path):
        try:
            from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        except ImportError:
            raise CorpusError("tokenizer 'bpe' needs the tokenizers library: pip install 'lengthgen[lm]'") from None
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=self.vocab_size_asked, special_tokens=list(SPECIALS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        bpe.train_from_iterator((text for _, text in self.documents("train")), trainer=trainer)
        bpe.save(str(folder / "tokenizer.json"))
        return bpe

    # -- token files -----------------------------------------------------------------------
    def ensure(self) -> Path:
        """The folder of the token files, built on first use (under a lock: parallel runs wait) and
        checked once per process against the sizes and digests recorded when it was built: a damaged
        file is rebuilt from the documents, with a note naming it, or stops with one line."""
        folder = self.tokens_folder()
        if folder in CHECKED:
            return folder
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            damage = cache_damage(folder)
            if damage:
                if (folder / "meta.json").is_file():
                    print(f"note: {damage}; rebuilding the token files", file=sys.stderr)
                try:
                    self.build(folder)
                except CorpusError as err:
                    raise CorpusError(f"{damage}, and it cannot be rebuilt: {err}" if (folder / "meta.json").is_file()
                                      else str(err)) from None
        CHECKED.add(folder)
        return folder

    def build(self, folder: Path) -> None:
        """The token files and meta.json (written last: a folder without it is rebuilt). A build that
        fails (a full disk) removes its temporary files, so a retry starts clean."""
        try:
            self.write_tokens(folder)
        finally:
            for tmp in (*folder.glob(".*.bin.tmp"), folder / "meta.json.tmp"):
                tmp.unlink(missing_ok=True)

    def write_tokens(self, folder: Path) -> None:
        bpe = self.train_bpe(folder) if self.tokenizer == "bpe" else None
        dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32
        meta = {"format": FORMAT, "source": self.source, "path": str(self.path), "tokenizer": self.tokenizer,
                "vocab_size": self.vocab_size, "dtype": np.dtype(dtype).name, "splits": {}}
        for split in SPLITS:
            docs = self.documents(split)
            tmp = folder / f".{split}.bin.tmp"
            tokens = characters = 0
            with open(tmp, "wb") as out:  # document by document: the corpus is never held twice
                for start in range(0, len(docs), 256):
                    chunk = docs[start:start + 256]
                    for ids in self.encode_many([text for _, text in chunk], bpe):
                        np.append(ids, EOS).astype(dtype).tofile(out)
                        tokens += len(ids) + 1
                    characters += sum(len(text) for _, text in chunk)
            tmp.replace(folder / f"{split}.bin")
            meta["splits"][split] = {"documents": len(docs), "characters": characters, "tokens": tokens,
                                     "names_sha256": hashlib.sha256("\n".join(n for n, _ in docs).encode()).hexdigest()}
        meta["files"] = {path.name: {"bytes": path.stat().st_size, "sha256": file_digest(path)}
                         for path in sorted(folder.glob("*.bin")) + sorted(folder.glob("tokenizer.json"))}
        (folder / "meta.json.tmp").write_text(json.dumps(meta, indent=1))
        (folder / "meta.json.tmp").replace(folder / "meta.json")

    def meta(self) -> dict:
        return json.loads((self.ensure() / "meta.json").read_text())

    def tokens(self, split: str) -> np.memmap:
        """The token stream of `split`, memory-mapped (read-only)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
        if split not in self._memmaps:
            folder = self.ensure()
            meta = self.meta()
            if meta["splits"][split]["tokens"] < 2:
                raise CorpusError(f"the {split} split of corpus {self.key()} is empty (too few documents?)")
            self._memmaps[split] = np.memmap(folder / f"{split}.bin", dtype=meta["dtype"], mode="r")
        return self._memmaps[split]

    def __getstate__(self):  # memmaps are reopened in each process
        return {**self.__dict__, "_memmaps": {}}
