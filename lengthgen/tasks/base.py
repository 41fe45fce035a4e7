"""The Task protocol and the Batch every task produces.

Layout of a batch (one row per sample, right-padded with PAD):

    inputs : question tokens (ending with '=') followed by the answer tokens
    targets: the next token at every scored position, IGNORE elsewhere

The scored positions run from the '=' token to the end of the answer. Tasks
whose answer length varies (binary_sum, unique_set) end it with one scored
EOS; where the question fixes the answer length (parity, copy, addition,
multiplication) there is no EOS, so no method is judged on guessing where an
answer of known length ends (the decimal tasks' `eos` option adds one, as Cho
et al. train, and `bos` a BOS before the question). Example (copy, n = 3):

    position   0    1    2    3    4    5
    inputs     0    1    1    =    0    1
    targets    .    .    .    0    1    1

This one layout serves every method: next-token prediction reads `inputs` as
they are; whole-answer ("in place") prediction blanks every input after the
question (`Batch.blank_answers`) and reads the same targets in one pass.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

IGNORE = -100  # target value of unscored positions (torch's cross-entropy default)
SPECIALS = ("<pad>", "<eos>", "_")  # every vocabulary starts with these three
PAD, EOS, BLANK = 0, 1, 2
# The most looped steps per unit of problem length any task's T(n) may take: T(n) <= this x n. Only
# multiplication's T(n) = len(a) x n exceeds n, and its len(a) is capped here: sampling costs
# len(a) x (len(a) + n) per sample (measured on one CPU thread, 256 samples of n = 1,000: 0.27 s
# at 64 bits, 1.8 s at 256, 15 s at 1,024), and a is "a short number" (1 or 2 bits in the papers).
# The stop rules' cap on iterations (lengthgen.methods.looped.stop_rules.MAX_STEPS) follows from it.
MAX_STEPS_PER_LENGTH = 64
MAX_VOCAB = 2 ** 20  # the largest vocabulary a task option may ask for: one embedding row per token


@dataclass
class Batch:
    inputs: Tensor  # (B, L) long
    targets: Tensor  # (B, L) long, IGNORE where not scored
    question_len: Tensor  # (B,) tokens up to and including '='
    lengths: Tensor  # (B,) problem length n of each sample
    n_steps: Tensor  # (B,) looped step count T(n) of each sample
    position_ids: Tensor | None = None  # (B, L) explicit position IDs, None = 0..L-1
    # (B, L) at each scored position the position ID of its target token (the next one),
    # IGNORE elsewhere: what Predictive Position Coupling learns to predict; tasks with
    # coupled IDs supply it, the others leave None
    target_ids: Tensor | None = None

    def __len__(self) -> int:
        return self.inputs.shape[0]

    @property
    def scored(self) -> Tensor:  # (B, L) bool
        return self.targets != IGNORE

    @property
    def widths(self) -> Tensor:  # (B,) columns each sample needs: one past its last scored position
        column = torch.arange(self.targets.shape[1], device=self.targets.device)
        return (column * self.scored).amax(1) + 1

    def to(self, device) -> "Batch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        moved = {k: (v.to(device, non_blocking=True) if v is not None else None) for k, v in moved.items()}
        return Batch(**moved)

    def select(self, index: Tensor) -> "Batch":
        """Rows `index` of the batch, trimmed to their own widest sample."""
        picked = {f.name: getattr(self, f.name) for f in fields(self)}
        picked = {k: (v[index] if v is not None else None) for k, v in picked.items()}
        width = int((picked["question_len"] + (picked["targets"] != IGNORE).sum(1) - 1).max())
        for k in ("inputs", "targets", "position_ids", "target_ids"):
            if picked[k] is not None:
                picked[k] = picked[k][:, :width]
        return Batch(**picked)

    def blank_answers(self) -> "Batch":
        """Inputs with every position after the question replaced by BLANK."""
        pos = torch.arange(self.inputs.shape[1], device=self.inputs.device)
        after = pos[None, :] >= self.question_len[:, None]
        return replace(self, inputs=self.inputs.masked_fill(after, BLANK))

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        """Stack batches of different widths, right-padding to the widest."""
        width = max(b.inputs.shape[1] for b in batches)

        def pad(t: Tensor, value: int) -> Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        has_pos = [b.position_ids is not None for b in batches]
        has_targets = [b.target_ids is not None for b in batches]
        if any(has_pos) and not all(has_pos) or any(has_targets) and not all(has_targets):
            raise ValueError("cannot concatenate batches with and without position_ids or target_ids")
        return Batch(
            inputs=torch.cat([pad(b.inputs, PAD) for b in batches]),
            targets=torch.cat([pad(b.targets, IGNORE) for b in batches]),
            question_len=torch.cat([b.question_len for b in batches]),
            lengths=torch.cat([b.lengths for b in batches]),
            n_steps=torch.cat([b.n_steps for b in batches]),
            position_ids=torch.cat([pad(b.position_ids, 0) for b in batches]) if all(has_pos) else None,
            target_ids=torch.cat([pad(b.target_ids, IGNORE) for b in batches]) if all(has_targets) else None,
        )


def make_batch(question: Tensor, question_len: Tensor, answer: Tensor, answer_len: Tensor,
               lengths: Tensor, n_steps: Tensor, eos: bool = True, bos: bool = False) -> Batch:
    """Build a Batch from right-padded question and answer token tensors.

    question: (B, Q) with question_len[b] valid tokens (the last one is '=')
    answer:   (B, A) with answer_len[b] valid tokens (EOS is appended here if eos)
    bos:      the question starts with one more token, EOS standing for BOS (as Cho et al.'s
              tokenizer does with bos_to_eos: one token opens and closes a sequence); never scored
    Vectorised: one gather per tensor, no loop over samples.
    """
    batch = question.shape[0]
    if bos:
        question = torch.cat([torch.full((batch, 1), EOS, dtype=question.dtype), question], 1)
        question_len = question_len + 1
    q, a = question_len[:, None], answer_len[:, None]
    # one past the last scored input column: the last answer token predicts EOS, or,
    # with eos=False (answer length known from the question), is never an input at all
    end = q + a - (0 if eos else 1)
    width = int(end.max())
    j = torch.arange(width + 1)[None, :].expand(batch, -1)  # (B, W+1) positions of seq
    in_question = j < q
    in_answer = (j >= q) & (j < q + a)
    q_tok = question.gather(1, j.clamp(max=question.shape[1] - 1))
    a_tok = answer.gather(1, (j - q).clamp(0, max(answer.shape[1] - 1, 0))) if answer.shape[1] else torch.zeros_like(j)
    seq = torch.where(in_question, q_tok, torch.where(in_answer, a_tok, torch.where(j == q + a, EOS, PAD)))
    inputs = seq[:, :width].masked_fill(j[:, :width] >= end, PAD)  # answer tokens feed the next prediction only
    scored = (j[:, :width] >= q - 1) & (j[:, :width] < end)
    targets = seq[:, 1:].masked_fill(~scored, IGNORE)
    return Batch(inputs=inputs, targets=targets, question_len=question_len.clone(),
                 lengths=lengths, n_steps=n_steps)


def end_with(tokens: Tensor, n: Tensor, token: int) -> Tensor:
    """(B, W + 1): row b of tokens (B, W) with `token` written at position n[b]."""
    out = torch.nn.functional.pad(tokens, (0, 1))
    return out.scatter_(1, n[:, None], token)


def uniform_below(n: Tensor, generator: torch.Generator) -> Tensor:
    """(B,) long: row b uniform over 0..n[b] - 1, from one torch.randint draw (53 random bits
    scaled by n[b], so a row's value depends on its own n only)."""
    bits = torch.randint(0, 2**53, n.shape, generator=generator)
    return (bits.double() / 2**53 * n).long().clamp(max=n - 1)


def prefix_mask(n: Tensor, width: int) -> Tensor:
    """(B, width) bool: True in the first n[b] columns of row b."""
    return torch.arange(width)[None, :] < n[:, None]


def reverse_prefix(x: Tensor, n: Tensor) -> Tensor:
    """Row b of x (B, W) with its first n[b] entries reversed and the rest zeroed:
    turns a right-padded MSB-first number into an LSB-first one (and back)."""
    k = torch.arange(x.shape[1])[None, :]
    flipped = x.gather(1, (n[:, None] - 1 - k).clamp(min=0))
    return flipped.masked_fill_(k >= n[:, None], 0)


class Task:
    """A length-generalisation task. Subclasses set the class attributes and `sample`.

    name:      registry name
    tokens:    the task's own tokens; token id = len(SPECIALS) + index
    sep:       string placed between tokens when rendering text
    answer_symbols: how many values one answer token can take (random baseline)
    eos:       whether answers end with a scored EOS (needed when their length varies)
    """

    name: str = ""
    tokens: tuple[str, ...] = ()
    sep: str = ""
    answer_symbols: int = 2
    eos: bool = True  # answers end with a scored EOS; False where the question fixes the answer length
    example: str = ""  # one rendered example for `lengthgen tasks`, e.g. "10110= -> 1"
    metric_names: tuple[str, ...] = ()  # the task's own metrics, beside accuracy and token_accuracy
    answer_region = True  # the scored positions are one answer after the question (False: inside it, as in LM)
    min_length = 1  # the shortest problem length the task can draw
    evaluation = "exact_match"  # how evaluation measures it (lengthgen.evaluation.evaluate.EVALUATORS)
    id_levels = 1  # levels packed in each position ID (lengthgen.tasks.coupled_levels); 1: plain IDs

    def __init__(self) -> None:  # tasks with options override this with keyword-only arguments
        pass

    def check(self, cfg, transform: type) -> None:
        """ValueError (naming the key) if the config asks of this task what it cannot do; `transform`
        is the position transform's class. Tasks add their own rules."""
        if cfg.eval.token_contexts:
            raise ValueError(f"eval.token_contexts scores tokens of a test split; {self.name} is not a "
                             "language-model task")

    @property
    def vocab(self) -> tuple[str, ...]:
        return SPECIALS + self.tokens

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def token_id(self, token: str) -> int:
        return len(SPECIALS) + self.tokens.index(token)

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        """`batch_size` samples of problem length `length`: one int for every sample,
        or a (batch_size,) long tensor of per-sample lengths (one vectorised pass)."""
        raise NotImplementedError

    @property
    def draws_own_lengths(self) -> bool:
        """Whether `sample_range` follows a law of the task's own rather than one uniform length
        per sample (then one length per batch would bypass it)."""
        return False

    def sample_range(self, batch_size: int, low: int, high: int, generator: torch.Generator) -> Batch:
        """A training batch over the lengths low..high: each sample's length uniform, then one
        `sample` call. A task whose data law draws its own lengths over a range (decimal_addition's
        independent operands) overrides it; a fixed length always goes through `sample`."""
        lengths = torch.randint(low, high + 1, (batch_size,), generator=generator)
        return self.sample(batch_size, lengths, generator)

    def check_length(self, length: int | Tensor, batch_size: int | None = None) -> None:
        """ValueError unless `length` is an int >= 1 or a 1-D long tensor of
        values >= 1 (of shape (batch_size,) when batch_size is given)."""
        if isinstance(length, Tensor):
            shape = (batch_size,) if batch_size is not None else (length.numel(),)
            if length.dtype != torch.long:
                raise ValueError(f"{self.name}: a length tensor must have dtype torch.long, got {length.dtype}")
            if length.dim() != 1 or tuple(length.shape) != shape:
                raise ValueError(f"{self.name}: a length tensor must have shape {shape}, "
                                 f"got {tuple(length.shape)}")
            if length.numel() and int(length.min()) < 1:
                raise ValueError(f"{self.name}: every length must be >= 1, got {int(length.min())}")
            return
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise ValueError(f"{self.name}: length must be an integer >= 1, got {length!r}")

    def lengths_of(self, batch_size: int, length: int | Tensor) -> tuple[Tensor, int]:
        """Validated per-sample lengths (B,) and their maximum, from either form of `length`."""
        self.check_length(length, batch_size)
        if isinstance(length, Tensor):
            return length.clone(), int(length.max())
        return torch.full((batch_size,), length), length

    def random_bits(self, batch_size: int, length: int | Tensor,
                    generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Validated per-sample lengths n (B,) and uniform random bits (B, max n),
        zero past n[b] so that row-wise sums count only a row's own bits."""
        n, width = self.lengths_of(batch_size, length)
        bits = torch.randint(0, 2, (batch_size, width), generator=generator)
        if isinstance(length, Tensor):
            bits.masked_fill_(~prefix_mask(n, width), 0)
        return n, bits

    def decode(self, ids) -> str:
        return self.sep.join(self.vocab[int(t)] for t in ids)

    def to_text(self, batch: Batch, i: int) -> tuple[str, str]:
        """(question, answer) of sample i as text, e.g. ("10110=", "1")."""
        q = int(batch.question_len[i])
        answer_ids = batch.targets[i][batch.targets[i] != IGNORE]
        if len(answer_ids) and int(answer_ids[-1]) == EOS:
            answer_ids = answer_ids[:-1]
        question_ids = batch.inputs[i, :q]
        if q and int(question_ids[0]) == EOS:  # a BOS (make_batch's bos) is framing, not text
            question_ids = question_ids[1:]
        return self.decode(question_ids), self.decode(answer_ids)

    def metrics(self, pred: Tensor, batch: Batch) -> dict[str, Tensor]:
        """The task's own metrics of predictions `pred` (B, L) (read at the scored positions),
        per sample: {name: (B,) float} for every name in `metric_names`. Evaluation averages
        them over the test samples into columns of eval.csv, as it does exact match."""
        return {}

    def source_positions(self, batch: Batch) -> Tensor | None:
        """(B, L) long: for each scored position, the input position that holds its answer
        (-1 where none does), or None if the task does not say. Drawn by the attention figure."""
        return None

    def random_baseline(self, length: int, samples: int = 2000) -> float:
        """Exact-match chance of guessing each answer token uniformly at random
        (answer length given), averaged over samples drawn at this length."""
        batch = self.sample(samples, length, torch.Generator().manual_seed(0))
        answer_len = batch.scored.sum(1) - (batch.targets == EOS).sum(1)  # EOS excluded: its place is known
        return float((self.answer_symbols ** -answer_len.double()).mean())


def score(pred: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
    """Per-sample (exact match, token accuracy) over the scored positions."""
    scored = batch.scored
    right = (pred == batch.targets) & scored
    exact = (right | ~scored).all(1)
    token = right.sum(1).float() / scored.sum(1).clamp(min=1)
    return exact, token


def measure(task: Task, pred: Tensor, batch: Batch) -> dict[str, Tensor]:
    """Every metric of `pred` (B, L) per sample: accuracy (exact match), token_accuracy and
    the task's own (Task.metrics)."""
    exact, token = score(pred, batch)
    return {"accuracy": exact, "token_accuracy": token, **task.metrics(pred, batch)}


def sample_mixed(task: Task, batch_size: int, low: int, high: int, generator: torch.Generator) -> Batch:
    """A batch of lengths in [low, high] by the task's law (`Task.sample_range`: per-sample
    lengths uniform, unless the task draws its own), in one vectorised pass."""
    for value in (low, high):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"sample_mixed: low and high must be integers, got {value!r}")
    if not 1 <= low <= high:
        raise ValueError(f"sample_mixed: need 1 <= low <= high, got low={low}, high={high}")
    return task.sample_range(batch_size, low, high, generator)


def pad_answers(batch: Batch, k: int, to_row: bool = False) -> Batch:
    """`batch` with k PAD targets scored after each answer (the released looped code's rows,
    padded to a fixed width with every slot after the answer a target): the loss, exact match
    and the confidence stop rule then read them too. `to_row`: first pad every row to the
    batch's widest scored row, then add k, so the pad count varies with the sample as in the
    released rows. Whole-answer methods blank those inputs like the answer's; next-token
    prediction reads the last answer token, then PADs."""
    if batch.position_ids is not None or batch.target_ids is not None:
        raise ValueError("trailing_pad cannot extend a task's own position IDs (coupled tasks)")
    rows = torch.arange(len(batch))
    end = batch.widths - 1  # each row's last scored column
    k = (int(end.max()) - end if to_row else torch.zeros_like(end)) + k  # (B,) pads per row
    width = batch.inputs.shape[1] + int(k.max()) + 1
    extra = width - batch.inputs.shape[1]
    inputs = torch.nn.functional.pad(batch.inputs, (0, extra), value=PAD)
    targets = torch.nn.functional.pad(batch.targets, (0, extra), value=IGNORE)
    inputs[rows, end + 1] = batch.targets[rows, end]  # the last answer token becomes an input
    column = torch.arange(width)[None, :]
    after = (column > end[:, None]) & (column <= (end + k)[:, None])
    targets = targets.masked_fill(after, PAD)
    keep = int((end + k).max()) + 1
    return Batch(inputs=inputs[:, :keep], targets=targets[:, :keep], question_len=batch.question_len,
                 lengths=batch.lengths, n_steps=batch.n_steps)


class TrailingPad:
    """A task whose answers are followed by scored PAD targets: `k` (`task.trailing_pad`), after
    padding each row to the batch's widest one if `to_row` (`task.pad_to_row`); every other
    attribute is the wrapped task's, and so is the random baseline (the pads are known)."""

    def __init__(self, task: Task, k: int, to_row: bool = False):
        if not task.answer_region:
            raise ValueError(f"trailing_pad and pad_to_row apply to tasks with one answer after the question; "
                             f"{task.name} is scored inside the sequence")
        self.task, self.k, self.to_row = task, k, to_row

    def __getattr__(self, name):
        return getattr(self.task, name)

    def sample(self, batch_size: int, length, generator: torch.Generator) -> Batch:
        return pad_answers(self.task.sample(batch_size, length, generator), self.k, self.to_row)

    @property
    def draws_own_lengths(self) -> bool:
        """Whether `sample_range` follows a law of the task's own rather than one uniform length
        per sample (then one length per batch would bypass it)."""
        return False

    def sample_range(self, batch_size: int, low: int, high: int, generator: torch.Generator) -> Batch:
        return pad_answers(self.task.sample_range(batch_size, low, high, generator), self.k, self.to_row)
