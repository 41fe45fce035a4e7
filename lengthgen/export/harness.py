"""A text run as a model of the lm-evaluation-harness (`lm_eval`, the `harness` extra):
`python -m lengthgen.export.harness --model lengthgen --model_args run=RUN --tasks … --include_path …`
(docs/export.md). RUN is a run folder of the `text` task or a folder of `lengthgen export`.

Rolling log-likelihood scores a document as lengthgen's own perplexity scores the test split
(lengthgen.evaluation.language_model): the document's tokens after an EOS (what precedes a
document in lengthgen's token streams) cut into consecutive non-overlapping windows of the
training window W; window k reads tokens kW .. kW+W-1 and predicts kW+1 .. kW+W, through the
task's own `windows` and the method's own `logits`. So lm_eval's byte perplexity of a document
(bytes tokenizer) is `lengthgen eval`'s perplexity of the same tokens at window W.
Log-likelihood scores a continuation from at most W - 1 tokens of its context (the last ones);
generation is greedy, one token at a time over the last W tokens.

Importing this module registers the model "lengthgen" with lm_eval (where lm_eval is installed);
lm_eval's own `lm_eval` command has no plugin hook, so `python -m lengthgen.export.harness` is
that command with the model registered.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from lengthgen.config.schema import DEVICE_PATTERN, parse_lengths
from lengthgen.errors import ResourceError, UserError
from lengthgen.evaluation.bounds import TOKEN_FACTOR, check_count
from lengthgen.evaluation.evaluate import latest_state, load_assembled
from lengthgen.runtime.devices import pick_device
from lengthgen.runtime.resources import available_memory
from lengthgen.tasks import EOS, IGNORE, PAD, Batch

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError:  # without the `harness` extra the module still imports; main() says what to install
    LM, register_model = object, None

INSTALL = "lm_eval is not installed: pip install 'lengthgen[harness]'"


def checked_device(device: str | None) -> torch.device:
    """The device lm_eval's --device names, refused in one line where it is not lengthgen's form or
    this machine lacks it (cuda without CUDA); None: the CPU."""
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        raise UserError(f"--device {device!r} is not a device lengthgen runs on: cpu, cuda, cuda:N, mps or auto")
    try:
        return pick_device(device)
    except UserError as err:
        raise UserError(str(err).replace("train.device", "--device")) from None


def load_text_run(run: str, device: str | None = None):
    """(run, model) of a text run folder or export; anything else is a one-line UserError."""
    if not run:
        raise UserError("--model_args needs run=RUN (a text run folder or a folder of `lengthgen export`)")
    assembled, model, _ = load_assembled(Path(str(run)), checked_device(device))
    if getattr(assembled.task, "corpus", None) is None:
        raise UserError(f"{run} is a run of the {assembled.cfg.task.name!r} task: the lm_eval model scores "
                        f"text runs only (task.name = text)")
    return assembled, model


LM_EVAL_GEN_TOKS = 256  # lm_eval's own default max_gen_toks: generation may always go that far
GEN_WHY = f": lm_eval's default {LM_EVAL_GEN_TOKS}, or {TOKEN_FACTOR} x the longest window it was trained or is evaluated at"


def generation_cap(run) -> int:
    """The most tokens one generation may ask for: lm_eval's default, or the window cap where wider."""
    return max(LM_EVAL_GEN_TOKS, window_cap(run))


def window_cap(run) -> int:
    """The widest window a text run could need: TOKEN_FACTOR x the longest window it was trained or is
    evaluated at (eval.lengths), for lengthgen's perplexity at 32x the training window included."""
    lengths = [run.cfg.task.train_max]
    try:
        lengths += parse_lengths(run.cfg.eval.lengths)
    except ValueError:
        pass
    return TOKEN_FACTOR * max(lengths)


class TextScorer:
    """Token log-probabilities of a text run: the part of the lm_eval model that needs no lm_eval."""

    def __init__(self, run: str, device: str | None = None, batch_size: int = 8, window: int | None = None):
        self.run, self.model = load_text_run(run, device)
        self.folder = Path(str(run))
        self.device = next(self.model.parameters()).device
        train_window = self.run.cfg.task.train_max  # lengthgen's training window, the default
        self.window = check_count("window", train_window if window is None else window, window_cap(self.run),
                                  f": {TOKEN_FACTOR} x the longest window it was trained or is evaluated at")
        self.batch_size = check_count("batch_size", batch_size, self.batch_cap(),
                                      f" rows of {self.window} tokens in this machine's free memory")
        self._bpe = None

    def batch_cap(self) -> int | None:
        """The most rows of `window` tokens whose logits and activations fit the device's free memory."""
        have = available_memory(self.device)
        if have is None:
            return None
        cfg = self.run.cfg.model
        per_row = 4 * self.window * (self.run.task.vocab_size + 16 * cfg.d_model * max(1, cfg.n_layer))
        return max(1, have // per_row)

    def encode(self, text: str) -> np.ndarray:
        corpus = self.run.task.corpus
        if corpus.tokenizer == "bpe" and self._bpe is None:
            from tokenizers import Tokenizer  # the run's own tokenizer.json, not the corpus's cache

            self._bpe = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        return corpus.encode_many([text], self._bpe)[0].astype(np.int64)

    def decode(self, ids) -> str:
        corpus = self.run.task.corpus
        if corpus.tokenizer == "bpe":
            self.encode("")  # loads the tokenizer
            return self._bpe.decode([int(i) for i in ids])
        return corpus.decode(ids)

    @torch.no_grad()
    def logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probability of each target, whether it is the argmax), 0 / True where not scored."""
        batch = batch.to(self.device)
        logits = self.run.method.logits(self.model, batch).float()
        scored = batch.targets != IGNORE
        target = batch.targets.clamp(min=0)
        picked = torch.log_softmax(logits, -1).gather(-1, target[..., None])[..., 0]
        greedy = logits.argmax(-1) == target
        return (picked * scored).double().cpu(), (greedy | ~scored).cpu()

    def rolling(self, text: str) -> float:
        """log p(text): its tokens after an EOS, in lengthgen's consecutive windows of `window`."""
        stream = np.concatenate([[EOS], self.encode(text)])
        starts = torch.arange(0, len(stream) - 1, self.window)
        total = 0.0
        for first in range(0, len(starts), self.batch_size):
            chunk = starts[first:first + self.batch_size]
            batch = self.run.task.windows(stream, chunk, torch.full((len(chunk),), self.window))
            total += float(self.logprobs(batch)[0].sum())
        return total

    def pair(self, context: str, continuation: str) -> tuple[np.ndarray, np.ndarray]:
        """(context tokens, continuation tokens), as lm_eval splits them: trailing spaces of the
        context move to the continuation, the continuation is what the whole adds to the context."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, head = self.encode(context + continuation), self.encode(context)
        return np.concatenate([[EOS], head]), whole[len(head):]

    def conditional(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[float, bool]]:
        """(log p(continuation | context), greedy?) of each pair; the context cut to its last tokens
        so that a row holds at most `window` inputs."""
        rows = []
        for head, tail in pairs:
            if len(tail) > self.window:
                raise UserError(f"a continuation of {len(tail)} tokens is longer than the window "
                                f"({self.window}): pass window=N in --model_args")
            rows.append(np.concatenate([head, tail])[-(self.window + 1):])
        out = []
        for first in range(0, len(rows), self.batch_size):
            chunk = list(range(first, min(first + self.batch_size, len(rows))))
            batch = rows_batch([rows[i] for i in chunk], [len(pairs[i][1]) for i in chunk])
            lp, greedy = self.logprobs(batch)
            out += [(float(lp[r].sum()), bool(greedy[r].all())) for r in range(len(chunk))]
        return out

    @torch.no_grad()
    def greedy(self, context: str, until: list[str], max_tokens: int) -> str:
        """Greedy continuation of `context`, cut at the first of `until`."""
        ids = list(np.concatenate([[EOS], self.encode(context)]))
        new: list[int] = []
        text = ""
        for _ in range(max_tokens):
            inputs = torch.tensor([ids[-self.window:]], device=self.device)
            n = torch.tensor([inputs.shape[1]], device=self.device)
            batch = Batch(inputs=inputs, targets=torch.full_like(inputs, IGNORE), question_len=n, lengths=n, n_steps=n)
            token = int(self.run.method.logits(self.model, batch)[0, -1].argmax())
            if token == EOS:
                break
            ids.append(token)
            new.append(token)
            text = self.decode(new)
            if any(stop and stop in text for stop in until):
                break
        for stop in until:
            text = text.split(stop)[0] if stop else text
        return text


def rows_batch(rows: list[np.ndarray], scored: list[int]) -> Batch:
    """Row b reads rows[b][:-1] and is scored on the last scored[b] of rows[b][1:]; right-padded."""
    width = max(len(r) for r in rows) - 1
    inputs = torch.full((len(rows), width), PAD, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for b, (row, k) in enumerate(zip(rows, scored)):
        row = torch.from_numpy(np.asarray(row, dtype=np.int64))
        inputs[b, :len(row) - 1] = row[:-1]
        targets[b, len(row) - 1 - k:len(row) - 1] = row[len(row) - k:]
    n = torch.tensor([len(r) - 1 for r in rows])
    return Batch(inputs=inputs, targets=targets, question_len=n, lengths=n.clone(), n_steps=n.clone())


class LengthgenLM(LM):
    """lm_eval's model "lengthgen": model_args run=RUN [window=W] [max_gen_toks=N], and lm_eval's
    --device and --batch_size ("auto": 8). Each is checked: a key it does not take, a count that is not
    a positive integer or is past what the run could need, a device the machine lacks, one line each."""

    def __init__(self, run: str = "", device: str | None = None, batch_size: int | str = 8, window: int | None = None,
                 max_gen_toks: int = 256, max_batch_size: int | None = None, **unknown):
        super().__init__()
        if unknown:
            raise UserError(f"--model_args has no key {sorted(unknown)[0]!r}; the lengthgen model takes run, window "
                            "and max_gen_toks (and lm_eval's --device and --batch_size)")
        if device is None:
            device = str(pick_device("auto"))
        batch_size = 8 if str(batch_size).startswith("auto") else batch_size
        self.scorer = TextScorer(run, device, batch_size, window)
        self.max_gen_toks = check_count("max_gen_toks", max_gen_toks, generation_cap(self.scorer.run), GEN_WHY)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self.scorer.conditional([self.scorer.pair(*r.args) for r in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return [self.scorer.rolling(r.args[0]) for r in requests]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in requests:
            context, kwargs = request.args
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            tokens = check_count("max_gen_toks", kwargs.get("max_gen_toks", self.max_gen_toks),
                                 generation_cap(self.scorer.run), GEN_WHY + " (the task's generation_kwargs)")
            out.append(self.scorer.greedy(context, until, tokens))
        return out


if register_model is not None:
    import lm_eval.models  # noqa: F401  (lm_eval's own models stay reachable by name beside this one)

    register_model("lengthgen")(LengthgenLM)


def named_run(argv: list[str]) -> str | None:
    """RUN of `--model lengthgen --model_args run=RUN,...` in lm_eval's arguments, else None."""
    values = {}
    for i, arg in enumerate(argv):
        for flag in ("--model", "--model_args"):
            if arg == flag and i + 1 < len(argv):
                values[flag] = argv[i + 1]
            elif arg.startswith(flag + "="):
                values[flag] = arg[len(flag) + 1:]
    if values.get("--model") != "lengthgen":
        return None
    pairs = (item.split("=", 1) for item in values.get("--model_args", "").split(",") if "=" in item)
    return dict(pairs).get("run")


def main() -> int:
    """lm_eval's command line with the model "lengthgen" registered."""
    if register_model is None:
        print(f"error: {INSTALL}", file=sys.stderr)
        return 2
    from lm_eval.__main__ import cli_evaluate

    try:
        run = named_run(sys.argv[1:])
        if run:
            latest_state(Path(run))  # a missing or broken run: refused before lm_eval indexes its tasks (seconds)
        cli_evaluate()
    except (UserError, ResourceError) as err:  # a bad --model_args, a missing device: one line
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
