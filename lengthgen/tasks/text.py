"""Language modelling on a text corpus (lengthgen.tasks.corpus): windows of n tokens.

    window "The quick brown"  ->  next tokens "he quick brown " (n = 15 bytes)

The problem length n is the window: the model reads n tokens and predicts
the next token at each of them, every position scored (plain language
modelling). Training draws windows at uniform random offsets of the training
split's token stream (documents joined by EOS; a window may cross a document
boundary, as in the usual LM training). Evaluation (lengthgen.evaluation.language_model) scores the
test split in consecutive non-overlapping windows instead, every test token
once per window size, and reports perplexity and the loss at each position of
the window.

Options: `source` (python-docs, files, wikitext-103, c4), `path`, `tokenizer`
(bytes, bpe), `vocab_size` (bpe) and `max_documents`, as in lengthgen.tasks.corpus.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .base import IGNORE, PAD, SPECIALS, Batch, Task, prefix_mask
from .corpus import Corpus


class Text(Task):
    name = "text"
    eos = False
    answer_region = False  # every position is scored
    example = "The quick brown -> he quick brown "
    metric_names = ("perplexity", "loss")
    evaluation = "perplexity"  # on the test split (lengthgen.evaluation.language_model), not on samples

    def __init__(self, *, source: str = "python-docs", path: str = "", tokenizer: str = "bytes", vocab_size: int = 0,
                 max_documents: int = 0):
        self.corpus = Corpus(source, path, tokenizer, vocab_size, max_documents)

    def check(self, cfg, transform: type) -> None:
        """A corpus is read, not drawn: no finite problem set, no exact-match tests during training,
        no position IDs drawn at evaluation; the corpus is there and tokenized before any folder is made."""
        if cfg.data.dataset_size:
            raise ValueError(f"data.dataset_size draws problems; {self.name} reads a corpus (set data.dataset_size=0)")
        if cfg.tests.interval:
            raise ValueError(f"tests.interval tests exact match; {self.name} is a language-model task "
                             "(use lengthgen eval)")
        if transform.random_at_evaluation:
            raise ValueError(f"data.position_transform {transform.name!r} draws position IDs at evaluation, which "
                             f"the perplexity of {self.name} does not; use pose or none")
        try:
            self.corpus.ensure()
        except ValueError as err:
            raise ValueError(f"task.options: {err}") from None
        held = len(self.corpus.tokens("train"))  # a window of n tokens reads n + 1 (its last target)
        if cfg.task.train_max + 1 > held:
            raise ValueError(f"task.train_max ({cfg.task.train_max}) asks for windows of {cfg.task.train_max + 1} "
                             f"tokens; the corpus's training split holds {held}: add documents or lower task.train_max")

    @property
    def vocab(self) -> tuple[str, ...]:  # token ids only; text goes through the corpus's tokenizer
        return SPECIALS + tuple(f"<{i}>" for i in range(len(SPECIALS), self.corpus.vocab_size))

    @property
    def answer_symbols(self) -> int:
        return self.corpus.vocab_size - len(SPECIALS)

    def windows(self, stream: np.ndarray, starts: Tensor, n: Tensor) -> Batch:
        """Row b: inputs stream[starts[b] : starts[b] + n[b]], targets shifted by one, right-padded;
        a target past the end of `stream` is not scored."""
        width = int(n.max())
        index = starts[:, None].numpy() + np.arange(width + 1)[None, :]
        inside = torch.from_numpy(index < len(stream))
        seq = torch.from_numpy(stream[np.minimum(index, len(stream) - 1)].astype(np.int64))
        real = prefix_mask(n, width)
        inputs = seq[:, :-1].masked_fill(~(real & inside[:, :-1]), PAD)
        targets = seq[:, 1:].masked_fill(~(real & inside[:, 1:]), IGNORE)
        return Batch(inputs=inputs, targets=targets, question_len=n.clone(), lengths=n.clone(), n_steps=n.clone())

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        """Windows of the training split at uniform random offsets."""
        n, width = self.lengths_of(batch_size, length)
        stream = self.corpus.tokens("train")
        if width + 1 > len(stream):
            raise ValueError(f"text: a window of {width} tokens is longer than the training split "
                             f"({len(stream)} tokens)")
        starts = torch.randint(0, len(stream) - width, (batch_size,), generator=generator)
        return self.windows(stream, starts, n)

    def to_text(self, batch: Batch, i: int) -> tuple[str, str]:
        scored = batch.targets[i] != IGNORE
        return self.corpus.decode(batch.inputs[i][scored]), self.corpus.decode(batch.targets[i][scored])

    def random_baseline(self, length: int, samples: int = 2000) -> float:
        """Next-token accuracy of a uniform guess (the rows' accuracy is per token for this task)."""
        return 1 / self.answer_symbols

    def save(self, folder: Path) -> None:
        """Copy the BPE tokenizer into a run folder, so that the run records what it read."""
        if self.corpus.tokenizer == "bpe":
            shutil.copyfile(self.corpus.ensure() / "tokenizer.json", Path(folder) / "tokenizer.json")
