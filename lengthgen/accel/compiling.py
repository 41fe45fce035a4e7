"""torch.compile for training and evaluation (train.compile, eval.compile): each block compiled
on its own, with dynamic shapes, by the inductor backend.

Why the blocks and not the whole step: the looped model runs its block T(n) times on packed rows
whose count changes every iteration, and a curriculum changes the length every few hundred steps.
A block compiled with dynamic shapes is one graph for all of them (the looped Parity CPU preset
made 4 graphs in 20 steps over lengths 1..12, forward and backward), where a compiled step would
be a new graph for every T(n) and every batch's lengths. `nn.Module.compile` compiles a module in
place, so parameter names, checkpoints and the EMA copy are those of the eager model.

The blocks are compiled in the default mode on every device: inductor's own CUDA graphs
("reduce-overhead") recorded a new graph for every packed shape and made a looped Parity step
5-50x slower than eager on an H200. CUDA graphs come from train.capture instead, which records the
whole step once per shape bucket (lengthgen.accel.captured); there the shapes are fixed, so the
step's loss is compiled whole instead of block by block (`compile_step`). Not compiled: the schemes that compute attention themselves (TRA, CoPE):
their queries run in Python-level chunks sized by the sequence length, so every length is a new
graph (8 recompilations in 20 steps of copy, then torch stops compiling them); they run eagerly,
with a note (a recorded step, of fixed shapes, compiles them whole). Whether compiling pays depends on how many steps share the compile time:
benchmarks/decisions/compile.py measures it, docs/benchmarks.md has the numbers and each preset says.

A compilation that fails (a missing C++ compiler, an operator inductor cannot lower) puts the
blocks back to eager with a one-line note, and training or evaluation goes on.
"""
from __future__ import annotations

import os
import sys

import torch
from torch import nn

from lengthgen.errors import first_line
from lengthgen.model.attention import EAGER_IN_COMPILED_BLOCKS
from lengthgen.accel import narrow_attention
from lengthgen.accel.narrow_attention import cache_folder


def compilable(model: nn.Module, whole: bool = False) -> str | None:
    """Why the model's blocks (or, `whole`, a recorded step's loss) cannot be compiled, or None.
    A recorded step has fixed shapes, so a scheme's chunks sized by the length are no obstacle."""
    if not hasattr(model, "blocks"):
        return "the model has no transformer blocks to compile (a recurrent model steps through its tape)"
    if getattr(model.scheme, "has_content", False) and not whole:
        return (f"model.position = {model.cfg.position!r} computes attention in query chunks sized by the "
                "sequence length, a new graph at every length")
    return None


def slower_compiled(model: nn.Module, device: torch.device) -> str | None:
    """Why compiling would slow this model's steps down, or None. On a CPU, heads at most 8 wide
    run lengthgen's narrow-head attention kernel, a C call that a compiled block cannot make (it
    traces SDPA instead): the looped Parity presets' steps were 0.80-0.97x eager compiled
    (docs/benchmarks.md, "Compiled blocks")."""
    head = model.cfg.d_model // model.cfg.n_head
    if (device.type == "cpu" and narrow_attention.enabled and head <= narrow_attention.MAX_HEAD_WIDTH
            and narrow_attention.library() is not None):
        return f"heads {head} wide on a CPU run the narrow-head attention kernel, faster eagerly"
    return None


def compile_blocks(model: nn.Module, device: torch.device, what: str = "train.compile") -> bool:
    """Compile each block of `model` in place; False, with a note, where it cannot be or would be slower."""
    reason = compilable(model) or slower_compiled(model, device)
    if reason:
        print(f"lengthgen: note: {what} is off for this run: {reason}", file=sys.stderr)
        return False
    run_eagerly_in_graphs()
    use_cache_folder()
    for block in model.blocks:
        block.compile(dynamic=True)
    return True


STEP_GRAPHS = 64  # graphs one compiled step may make: one per shape bucket (torch stops at 8 by default)


def compile_step(loss):
    """`loss(model, batch, iterations)`, a captured step's fixed-shape loss (lengthgen.accel.captured),
    compiled whole with static shapes: one graph per shape bucket, its forward over every loop
    iteration and its backward fused by inductor, then recorded inside the step's CUDA graph.
    Compiled whole, the element-wise work of every iteration and the summing of a looped weight's
    gradients over the iterations fuse; compiled block by block they cannot (a looped Parity CPU
    step of 20 iterations ran 1,123 kernels eagerly, 509 compiled whole: docs/benchmarks.md)."""
    use_cache_folder()
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), STEP_GRAPHS))
    return torch.compile(loss, dynamic=False)


def compiled_whole(model: nn.Module, loss):
    """`loss` compiled by compile_step, or None, with a note, where `model` cannot be compiled."""
    reason = compilable(model, whole=True)
    if reason:
        print(f"lengthgen: note: train.compile is off for this run: {reason}", file=sys.stderr)
        return None
    return compile_step(loss)


def use_cache_folder() -> None:
    """inductor's kernels and graphs (about 150 MB for a run) go to lengthgen's cache folder, not to
    $TMPDIR, where nothing clears them (docs/faults.md, "What is left on disk"), and every later run
    with the same shapes reuses them. A user's own TORCHINDUCTOR_CACHE_DIR wins. Importing
    torch._dynamo sets the variable to inductor's default (/tmp/torchinductor_USER), and lengthgen
    imports it before compiling (to count graphs), so that default counts as unset; inductor reads
    the variable each time it looks for its cache."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not current or os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_folder() / "inductor")


def run_eagerly_in_graphs() -> None:
    """torch.compiler.disable on the methods of EAGER_IN_COMPILED_BLOCKS, once per process."""
    for cls, names in EAGER_IN_COMPILED_BLOCKS.items():
        for name in names:
            method = cls.__dict__[name]
            if not getattr(method, "_torchdynamo_disable", False):
                setattr(cls, name, torch.compiler.disable(method))


def uncompile(model: nn.Module) -> None:
    """Back to the eager blocks (nn.Module.compile keeps the compiled call beside the module)."""
    for block in model.blocks:
        block._compiled_call_impl = None


def compile_failed(err: BaseException) -> bool:
    """An error raised by dynamo or inductor while compiling, not by the model's own code."""
    return type(err).__module__.startswith(("torch._dynamo", "torch._inductor"))


def fall_back(model: nn.Module, err: BaseException, what: str = "train.compile") -> None:
    uncompile(model)
    torch._dynamo.reset()
    first = first_line(err)
    print(f"lengthgen: note: {what}: compiling failed ({type(err).__name__}: {first}); "
          "running eagerly", file=sys.stderr)


def compilations() -> int:
    """Graphs compiled so far in this process (every recompilation for a new shape counts)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
