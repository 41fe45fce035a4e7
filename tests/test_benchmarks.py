"""benchmarks/paper_hours.py --compile: the kernel and launch counts its GPU estimate rests on."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lengthgen.config import presets
from lengthgen.methods.registry import get_method
from lengthgen.model import compiling
from lengthgen.tasks import task_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import paper_hours  # noqa: E402


def test_views_launch_nothing_and_fused_kernels_do():
    assert not paper_hours.is_kernel("aten::view") and not paper_hours.is_kernel("aten::transpose")
    assert paper_hours.is_kernel("aten::mm") and paper_hours.is_kernel("graph_3_cpp_fused_gelu_1")
    assert not paper_hours.is_kernel("CompiledFunction")


@pytest.mark.slow  # compiles a block
def test_compiled_blocks_are_one_launch_each_with_graphs():
    torch._dynamo.reset()
    cfg = presets.load(None, ["method=looped", "task.name=parity", "task.train_max=4", "model.d_model=16",
                              "model.n_layer=1", "model.n_head=2", "train.device=cpu"])
    task, method = task_of(cfg.task), get_method(cfg.method)
    model = method.build_model(cfg, task)
    batch = method.model_batch(task.sample(8, 4, torch.Generator().manual_seed(0)))

    def step():
        method.loss(model, batch).backward()

    eager, eager_launches = paper_hours.kernel_counts(step)
    assert eager > 0 and eager_launches == eager  # no graphs: every kernel is a launch
    compiling.compile_blocks(model, torch.device("cpu"), "test")
    step()  # compiles
    kernels, launches = paper_hours.kernel_counts(step)
    # parity at length 4 runs the block T(4) = 4 times: 4 forward + 4 backward graph calls replace
    # every kernel inside them
    assert launches < kernels and launches >= 8
