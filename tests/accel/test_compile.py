"""train.compile and eval.compile: compiled blocks train and evaluate as the eager ones do (losses
within 1e-4 relative over the first steps, equal accuracy on a fixed test set) for the looped,
next-token and PPC paths; TRA runs eagerly with a note; a compilation that fails
falls back to eager with a note and the run goes on."""
from __future__ import annotations

import json
import os

import pytest
import torch

from lengthgen.accel import compiling

from lengthgen.assembly.runs import new_run_config
from lengthgen.evaluation.evaluate import evaluate_run
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.methods.registry import get_method
from lengthgen.tasks import task_of
from lengthgen.training.trainer import train

pytestmark = pytest.mark.slow  # each compilation takes seconds

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.batch_size=8", "train.steps=8",
        "train.log_interval=1", "train.checkpoint_interval=100", "train.device=cpu", "optim.lr=3e-3",
        "eval.samples=32"]
PATHS = {
    "looped": ["method=looped", "task.name=parity", "task.train_max=4", "eval.lengths=2,4"],
    "ntp": ["task.name=copy", "task.train_max=4", "eval.lengths=2,4"],
    "ppc": ["method=ppc", "task.name=unique_set", "task.options={symbols=8, coupled=true}", "task.train_max=4",
            "model.position=learned", "model.max_positions=24", "data.position_transform=random_offset",
            "data.position_transform_options={max_position=16, keep_zero=true}", "eval.lengths=2,4"],
}


def run(folder, *sets: str) -> tuple[list[dict], list[dict]]:
    """(metrics rows, eval rows) of a trained and evaluated tiny run."""
    train(new_run_config(None, TINY + list(sets)), folder, progress=False)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return rows, evaluate_run(folder, EvalSettings(lengths=[2, 4], samples=32, progress=False))


@pytest.fixture(autouse=True)
def without_narrow_kernel(monkeypatch):
    """Heads this narrow on one thread would take the narrow-head kernel and not compile
    (compiling.slower_compiled); these tests are about the compiled path."""
    from lengthgen.accel import narrow_attention
    monkeypatch.setattr(narrow_attention, "enabled", False)


def test_narrow_heads_on_a_cpu_stay_eager(monkeypatch, capsys):
    from lengthgen.accel import compiling, narrow_attention
    monkeypatch.setattr(narrow_attention, "enabled", True)
    monkeypatch.setattr(narrow_attention, "library", lambda: object())  # as where a C compiler built it
    cfg = new_run_config(None, TINY + PATHS["looped"])
    model = get_method("looped").build_model(cfg, task_of(cfg.task))
    assert not compiling.compile_blocks(model, torch.device("cpu"))
    assert "narrow-head attention kernel" in capsys.readouterr().err
    monkeypatch.setattr(narrow_attention, "library", lambda: None)  # no compiler: SDPA either way, compiled
    assert compiling.slower_compiled(model, torch.device("cpu")) is None


@pytest.mark.parametrize("path", PATHS)
def test_compiled_blocks_train_and_evaluate_as_eager_ones(tmp_path, path):
    torch._dynamo.reset()
    eager, eager_rows = run(tmp_path / "eager", *PATHS[path])
    compiled, compiled_rows = run(tmp_path / "compiled", *PATHS[path], "train.compile=true", "eval.compile=true")
    for a, b in zip(eager, compiled):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(a["loss"]), (a, b)
    graphs = [row["compiled_graphs"] for row in compiled]
    assert 1 <= graphs[0] and graphs[-1] <= 8  # one graph per block and shape family, not one per step
    assert "compiled_graphs" not in eager[0]
    assert [r["accuracy"] for r in eager_rows] == [r["accuracy"] for r in compiled_rows]
    assert (tmp_path / "compiled" / "checkpoints" / "step_00000008" / "model.safetensors").is_file()


def test_compiled_blocks_leave_packing_and_the_kv_cache_eager():
    """Packed's runs and the KV cache's growing length would be a new graph per batch layout or
    decoded token: compile_blocks marks them eager (not at import: that loads torch._dynamo)."""
    cfg = new_run_config(None, TINY + PATHS["looped"])
    assert compiling.compile_blocks(get_method(cfg.method).build_model(cfg, task_of(cfg.task)), torch.device("cpu"))
    eager = {(cls.__name__, name): getattr(cls.__dict__[name], "_torchdynamo_disable", False)
             for cls, names in compiling.EAGER_IN_COMPILED_BLOCKS.items() for name in names}
    assert eager == {("Packed", "pad_runs"): True, ("Packed", "unpad_runs"): True, ("KVCache", "extend"): True}


def test_the_compile_cache_goes_to_lengthgens_cache_folder_not_tmp(monkeypatch, tmp_path):
    """Inductor's default, /tmp/torchinductor_USER, is never cleared (about 150 MB a compiled run)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # restored after the test
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("LENGTHGEN_CACHE", str(tmp_path))
    cfg = new_run_config(None, TINY)
    assert compiling.compile_blocks(get_method(cfg.method).build_model(cfg, task_of(cfg.task)), torch.device("cpu"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")


def test_the_compile_cache_moves_from_the_default_that_importing_dynamo_sets(monkeypatch, tmp_path):
    """Importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR to /tmp/torchinductor_USER before
    lengthgen compiles: that default is moved to lengthgen's folder, and kernels are written
    there; a folder the user chose stays."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    monkeypatch.setenv("LENGTHGEN_CACHE", str(tmp_path))
    compiled = compiling.compile_step(lambda x: (x * 1.2345).sin())  # a graph no earlier test compiled
    compiled(torch.randn(5))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert any((tmp_path / "inductor").rglob("*.py"))  # inductor's generated code, in lengthgen's folder
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    compiling.use_cache_folder()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_tra_runs_eagerly_with_a_note(tmp_path, capsys):
    sets = ["task.name=copy", "task.train_max=4", "model.position=tra", "eval.lengths=2,4"]
    eager, _ = run(tmp_path / "eager", *sets)
    compiled, _ = run(tmp_path / "compiled", *sets, "train.compile=true")
    assert "train.compile is off for this run" in capsys.readouterr().err
    assert [r["loss"] for r in eager] == [r["loss"] for r in compiled]  # the very same eager computation
    assert "compiled_graphs" not in compiled[0]


def test_a_failed_compilation_falls_back_to_eager_with_a_note(tmp_path, capsys, monkeypatch):
    def failing(graph, example_inputs):
        raise RuntimeError("no C++ compiler here")

    real = compiling.compile_blocks

    def with_failing_backend(model, device, what="train.compile"):
        for block in model.blocks:
            block.compile(backend=failing)
        return True

    torch._dynamo.reset()
    monkeypatch.setattr(compiling, "compile_blocks", with_failing_backend)
    monkeypatch.setattr("lengthgen.accel.hook.compile_blocks", with_failing_backend)
    sets = PATHS["ntp"]
    compiled, _ = run(tmp_path / "compiled", *sets, "train.compile=true")
    err = capsys.readouterr().err
    assert "train.compile: compiling failed (BackendCompilerFailed" in err and "running eagerly" in err
    monkeypatch.setattr("lengthgen.accel.hook.compile_blocks", real)
    eager, _ = run(tmp_path / "eager", *sets)
    assert [r["loss"] for r in eager] == pytest.approx([r["loss"] for r in compiled], rel=1e-6)
