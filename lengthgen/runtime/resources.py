"""The machine's limits as one-line errors: memory, disk, permissions.

Before a run starts, `check_fits` compares a lower bound of the memory training needs with what
the device has, so a size that cannot fit (an embedding of 10^8 symbols, a batch of 10^8) is
refused before anything is allocated or written. The bound counts only what training must hold
at once: every parameter four times over (weights, gradients and AdamW's two moments, fp32) and
each block's input for the backward pass (batch x tokens x d_model); the real need is higher, so
these terms never refuse a run that would fit. Attention is counted too, as the bias and content
paths hold it (each block keeps its weights, batch x heads x tokens^2, for the backward pass), so a
length whose attention alone exceeds the machine is refused up front rather than killed by the
kernel's OOM killer mid-run; and so are a finite training set, the tests during training and the
run's own evaluation set. The message names the keys of the largest term. `eval_batch` bounds an
evaluation the same way (the weights, the test set held whole, and one block's activations,
attention weights and logits per sequence) and returns the largest batch that fits, so a long
length is evaluated in smaller batches instead of failing. What the bounds miss fails at run time, and
`is_out_of_memory` / `os_error_line` turn those failures into one line naming the resource and
what to change (lengthgen.cli prints them; training adds the step and the checkpoint it keeps).
"""
from __future__ import annotations

import errno
import os
import re
import resource
from pathlib import Path

import torch

from lengthgen.config.schema import Config, ModelConfig, parse_lengths
from lengthgen.model.positions import SCHEMES
from lengthgen.model.transformer import MLPS
from lengthgen.tasks import TASKS

DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # EFBIG: a file-size limit (ulimit -f)
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KiB": sizes in messages, in the unit that shows them."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def available_memory(device: torch.device) -> int | None:
    """Bytes the device can hold: a GPU's memory, or on the CPU the least of the machine's RAM, the
    process's address-space limit (ulimit -v) and its cgroup's limit; None where unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type != "cpu":
        return None
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft)
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            limits.append(int(text))
    except OSError:
        pass
    return min(limits) if limits else None


def parameters_at_least(m: ModelConfig, vocab_size: int) -> int:
    """The parameters of the model's matrices (biases, norms and any scheme's own left out; a gated
    MLP has three matrices, the others two)."""
    per_block = 4 * m.d_model ** 2 + MLPS[m.mlp][0].matrices * m.mlp_ratio * m.d_model ** 2
    tables = vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    if SCHEMES[m.position].trains_table:
        tables += m.max_positions * m.d_model
    return tables + m.n_layer * per_block


FP32 = 4  # bytes of a float32: weights, activations and attention weights
TOKEN = 16  # bytes per token of a test sample held in memory: int64 inputs and targets


def _terms_line(terms: dict) -> tuple[int, str, str]:
    """(total bytes, the terms as text, the keys of the largest term): the message names what dominates."""
    total = sum(size for size, _, _ in terms.values())
    how = "; ".join(f"{name} {human_bytes(size)} ({what})" for name, (size, what, _) in terms.items() if size)
    keys = max(terms.values(), key=lambda term: term[0])[2]
    return total, how, keys


def attention_held(m: ModelConfig, device: torch.device | None) -> bool:
    """Whether attention's weights (batch x heads x tokens^2) are held: always by the bias and content
    paths; on CUDA, plain SDPA's fused kernels keep only O(tokens) per head, so there they are not."""
    scheme = SCHEMES[m.position]
    return device is None or device.type != "cuda" or scheme.has_bias or scheme.has_content


def training_terms(cfg: Config, vocab_size: int, tokens: int, device: torch.device | None = None) -> dict:
    """{name: (a lower bound of the bytes training holds for it, how it is made up, the keys that set it)}."""
    m, tr, te = cfg.model, cfg.train, cfg.tests
    heads = m.n_head if attention_held(cfg.model, device) else 0
    per_param = FP32 * (4 + (cfg.optim.ema > 0))  # weights, gradients, AdamW's 2 moments (+ EMA), fp32
    tables = vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    positions = m.max_positions * m.d_model if SCHEMES[m.position].trains_table else 0
    blocks = parameters_at_least(cfg.model, vocab_size) - tables - positions
    test_length = max(parse_lengths(te.lengths), default=0) if te.lengths else 0
    tested = te.samples * max(test_length, cfg.task.train_max) * TOKEN if te.interval else 0
    # the run's own evaluation (eval.samples at eval.lengths) holds its test set whole; a corpus's is read from disk
    held = TASKS[cfg.task.name].evaluation == "exact_match" if cfg.task.name in TASKS else False
    evaluated = cfg.eval.samples * max(parse_lengths(cfg.eval.lengths)) * TOKEN if held else 0
    return {  # the keys to lower, largest lever first
        "token tables": (tables * per_param, f"vocabulary {vocab_size:,} x d_model {m.d_model:,}",
                         "the task's vocabulary (task.options) or model.d_model"),
        "position table": (positions * per_param, f"max_positions {m.max_positions:,} x d_model {m.d_model:,}",
                           "model.max_positions"),
        "blocks": (blocks * per_param, f"{m.n_layer:,} blocks of d_model {m.d_model:,}",
                   "model.n_layer or model.d_model"),
        "blocks' inputs": (m.n_layer * tr.batch_size * tokens * m.d_model * FP32,  # saved for backward
                           f"{m.n_layer:,} x batch {tr.batch_size:,} x {tokens:,} tokens x d_model {m.d_model:,}",
                           "train.batch_size, model.n_layer or model.d_model"),
        # each block keeps its attention weights for the backward pass: batch x heads x tokens^2
        "attention": (m.n_layer * tr.batch_size * heads * tokens ** 2 * FP32,
                      f"{m.n_layer:,} x batch {tr.batch_size:,} x {m.n_head:,} heads x {tokens:,}² tokens",
                      "task.train_max, train.batch_size or model.n_head"),
        # a finite set holds every sample, at least train_min tokens each, as int16 inputs and targets
        "training set": (cfg.data.dataset_size * cfg.task.train_min * 4, f"{cfg.data.dataset_size:,} samples",
                         "data.dataset_size"),
        "tests": (tested, f"{te.samples:,} samples of up to {max(test_length, cfg.task.train_max):,} tokens",
                  "tests.samples or tests.lengths"),
        "evaluation's test set": (evaluated, f"{cfg.eval.samples:,} samples of up to "
                                  f"{max(parse_lengths(cfg.eval.lengths)):,} tokens", "eval.samples (--samples)"),
    }


def training_memory(cfg: Config, vocab_size: int, tokens: int) -> tuple[int, str]:
    """(a lower bound of the bytes training holds, how it is made up)."""
    total, how, _ = _terms_line(training_terms(cfg, vocab_size, tokens))
    return total, how


def check_fits(cfg: Config, vocab_size: int, tokens: int, device: torch.device) -> None:
    """Refuse, naming the sizes and the keys of the largest term, a run whose lower bound exceeds the device."""
    from lengthgen.errors import ResourceError

    have = available_memory(device)
    need, how, keys = _terms_line(training_terms(cfg, vocab_size, tokens, device))
    if have is not None and need > have:
        raise ResourceError(f"this run needs at least {human_bytes(need)} to train ({how}); the {device.type} has "
                            f"{human_bytes(have)}: lower {keys}")


def sample_bytes(batch) -> int:
    """Bytes one sample of `batch` (a tasks.Batch) holds in memory, every tensor of it counted."""
    held = sum(t.nbytes for t in vars(batch).values() if isinstance(t, torch.Tensor))
    return -(-held // len(batch))


def evaluation_terms(m: ModelConfig, vocab_size: int, width: int, batch: int, device: torch.device | None = None) -> dict:
    """{name: (bytes, how, keys)} of one forward pass of `batch` sequences of `width` tokens, without
    gradients: one block's input, output and MLP units, its attention weights, and the logits."""
    heads = m.n_head if attention_held(m, device) else 0
    return {
        "attention": (batch * heads * width ** 2 * FP32, f"batch {batch:,} x {heads} heads x {width:,}² tokens",
                      "--batch-size"),
        "activations": (batch * width * m.d_model * (2 + m.mlp_ratio) * FP32,
                        f"batch {batch:,} x {width:,} tokens x d_model {m.d_model:,} x {2 + m.mlp_ratio}",
                        "--batch-size"),
        "logits": (batch * width * vocab_size * FP32, f"batch {batch:,} x {width:,} tokens x {vocab_size:,} symbols",
                   "--batch-size"),
    }


def eval_batch(m: ModelConfig, vocab_size: int, length: int, width: int, per_sample: int, samples: int, batch: int,
               device: torch.device) -> int:
    """The largest batch, at most `batch`, whose evaluation at `length` (sequences of `width` tokens, a
    test set of `samples` x `per_sample` bytes held whole) fits the device's memory under a lower
    bound; ResourceError, naming the largest term, if the test set or a single sequence cannot."""
    from lengthgen.errors import ResourceError

    have = available_memory(device)
    if have is None:
        return batch
    fixed = parameters_at_least(m, vocab_size) * FP32 + samples * per_sample  # weights, the test set
    if fixed > have:
        raise ResourceError(f"the test set of {samples:,} samples at length {length:,} "
                            f"({human_bytes(samples * per_sample)}) and the weights need at least "
                            f"{human_bytes(fixed)}; the {device.type} has "
                            f"{human_bytes(have)}: lower --samples (eval.samples)")
    one, how, _ = _terms_line(evaluation_terms(m, vocab_size, width, 1, device))
    if fixed + one > have:  # no batch is small enough: only a shorter length is
        raise ResourceError(f"evaluating length {length:,} needs at least {human_bytes(fixed + one)} for one sequence "
                            f"of {width:,} tokens ({how}); the {device.type} has {human_bytes(have)}: evaluate "
                            "shorter lengths (--lengths)")
    return min(batch, (have - fixed) // one)  # every term grows linearly with the batch


# the least a test sample holds, whatever its task and length: a question and an answer token (int64
# inputs and targets) and its three counts (question length, problem length, T(n))
SAMPLE_AT_LEAST = 2 * TOKEN + 3 * 8


def check_samples(samples: int, flag: str) -> None:
    """ResourceError if `samples` test samples of one length cannot be held in this machine's memory
    at any length (evaluation draws a length's test set whole, on the CPU): before a grid trains runs
    that could never be evaluated."""
    from lengthgen.errors import ResourceError

    have, need = available_memory(torch.device("cpu")), samples * SAMPLE_AT_LEAST
    if have is not None and need > have:
        raise ResourceError(f"{samples:,} test samples of a length need at least {human_bytes(need)} "
                            f"({SAMPLE_AT_LEAST} bytes each); the cpu has {human_bytes(have)}: lower {flag}")


def batches_that_fit(cfg: Config, cases: list, samples: int, batch: int,
                     device: torch.device) -> tuple[dict, str | None]:
    """{(task, length): (batch, window tokens)} for every case of an evaluation, each batch lowered
    where `batch` would not fit (`eval_batch`), and a note naming the lowered ones (None if none).
    Every case is checked before any is evaluated, so one that cannot fit at all stops the evaluation
    before it starts. A perplexity task's batch is windows of `length` tokens (its test split is read
    from disk, not held)."""
    if available_memory(device) is None:
        return {(task, n): (batch, batch * cfg.task.train_max) for task, n in cases}, None
    fits, lowered = {}, []
    for task, length in cases:
        try:
            one = task.sample(1, length, torch.Generator().manual_seed(0))
        except ValueError:  # a length the task refuses: the evaluation names it when it gets there
            fits[task, length] = (batch, batch * cfg.task.train_max)
            continue
        read = task.evaluation == "perplexity"
        asked = max(1, batch * cfg.task.train_max // length) if read else batch
        fit = eval_batch(cfg.model, task.vocab_size, length, one.inputs.shape[1], 0 if read else sample_bytes(one),
                         0 if read else samples, asked, device)
        fits[task, length] = (fit, fit * length)
        if fit < asked:
            lowered.append(f"length {length:,} in batches of {fit:,}")
    note = None if not lowered else (
        f"note: batches lowered to fit the {device.type}'s {human_bytes(available_memory(device))} (asked {batch:,}; "
        "the same test set): " + ", ".join(dict.fromkeys(lowered)))
    return fits, note


def is_out_of_memory(err: BaseException) -> bool:
    """torch's CUDA and CPU allocators, and Python's, failing for lack of memory."""
    if isinstance(err, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def oom_detail(err: BaseException) -> str:
    """What did not fit, from the allocator's message: "could not allocate 200.0 MiB"."""
    text = str(err)
    found = re.search(r"tried to allocate (\d+) bytes", text)
    if found:
        return f"could not allocate {int(found.group(1)) / 2**20:,.1f} MiB"
    found = re.search(r"Tried to allocate ([\d.]+ [KMG]iB)", text)  # CUDA's allocator
    return f"could not allocate {found.group(1)}" if found else (text.splitlines()[0][:120] if text else "MemoryError")


def os_error_line(err: OSError, elsewhere: str = "--out") -> str:
    """An OSError as one line: what could not be done to which path, and what to do. `elsewhere`
    names how to write somewhere else: --out, or $LENGTHGEN_DATA for `corpus`, which has none."""
    if err.filename is None and err.errno not in DISK_FULL | NOT_WRITABLE:  # a socket, a pipe: no file
        return f"{type(err).__name__}: {err.strerror or err}"  # (not "a file: Connection refused")
    path = err.filename or "a file"
    if err.errno in DISK_FULL:
        return f"no space left to write {path} ({err.strerror}): free space on its disk or give another {elsewhere}"
    if err.errno in NOT_WRITABLE:
        if err.errno != errno.EROFS and Path(path).is_file() and not os.access(path, os.R_OK):
            return f"cannot read {path} ({err.strerror}): make it readable, or leave it out"  # an input, not --out
        return f"cannot write {path} ({err.strerror}): give a folder you can write ({elsewhere})"
    return f"{path}: {err.strerror or err}"
