"""The machine's limits as one-line errors: memory, disk, permissions.

Before a run starts, `check_fits` compares a lower bound of the memory training needs with what
the device has, so a size that cannot fit (an embedding of 10^8 symbols, a batch of 10^8) is
refused before anything is allocated or written. The bound counts only what training must hold
at once: every parameter four times over (weights, gradients and AdamW's two moments, fp32) and
each block's input for the backward pass (batch x tokens x d_model); the real need is higher, so
the check never refuses a run that would fit. What the bound misses fails at run time, and
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

from lengthgen.config.schema import Config
from lengthgen.model.transformer import MLPS

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


def parameters_at_least(cfg: Config, vocab_size: int) -> int:
    """The parameters of the model's matrices (biases, norms and any scheme's own left out; a gated
    MLP has three matrices, the others two)."""
    m = cfg.model
    per_block = 4 * m.d_model ** 2 + MLPS[m.mlp][0].matrices * m.mlp_ratio * m.d_model ** 2
    tables = vocab_size * m.d_model * (1 if m.tie_embeddings else 2)
    if m.position == "learned":
        tables += m.max_positions * m.d_model
    return tables + m.n_layer * per_block


def training_memory(cfg: Config, vocab_size: int, tokens: int) -> tuple[int, str]:
    """(a lower bound of the bytes training holds, how it is made up)."""
    params = parameters_at_least(cfg, vocab_size)
    weights = params * 4 * (4 + (cfg.train.ema > 0))  # weights, gradients, AdamW's 2 moments (+ EMA), fp32
    inputs = cfg.model.n_layer * cfg.train.batch_size * tokens * cfg.model.d_model * 4  # saved for backward
    how = (f"{params:,} parameters x {4 * (4 + (cfg.train.ema > 0))} bytes = {human_bytes(weights)}, and "
           f"{cfg.model.n_layer} blocks' inputs of {cfg.train.batch_size:,} x {tokens:,} tokens x "
           f"d_model {cfg.model.d_model:,} = {human_bytes(inputs)}")
    return weights + inputs, how


def check_fits(cfg: Config, vocab_size: int, tokens: int, device: torch.device) -> None:
    """Refuse, naming the sizes and the keys that set them, a run whose lower bound exceeds the device."""
    from lengthgen.errors import ResourceError

    have = available_memory(device)
    need, how = training_memory(cfg, vocab_size, tokens)
    if have is not None and need > have:
        raise ResourceError(
            f"this run needs at least {human_bytes(need)} to train ({how}); the {device.type} has "
            f"{human_bytes(have)}: lower train.batch_size, model.d_model or the task's vocabulary (task.options)")


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


def os_error_line(err: OSError) -> str:
    """An OSError as one line: what could not be done to which path, and what to do."""
    path = err.filename or "a file"
    if err.errno in DISK_FULL:
        return f"no space left to write {path} ({err.strerror}): free space on its disk or give another --out"
    if err.errno in NOT_WRITABLE:
        return f"cannot write {path} ({err.strerror}): give a folder you can write (--out)"
    return f"{path}: {err.strerror or err}"
