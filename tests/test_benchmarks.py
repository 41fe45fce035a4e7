"""benchmarks/paper_hours.py --compile: the kernel and launch counts its GPU estimate rests on;
benchmarks/narrow_attention.py: the steps a run spends at each length, which weigh its whole-run time."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from lengthgen import assembly
from lengthgen.methods.registry import get_method
from lengthgen.model import compiling
from lengthgen.tasks import task_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import narrow_attention as narrow_benchmark  # noqa: E402
import paper_hours  # noqa: E402


def test_views_launch_nothing_and_fused_kernels_do():
    assert not paper_hours.is_kernel("aten::view") and not paper_hours.is_kernel("aten::transpose")
    assert paper_hours.is_kernel("aten::mm") and paper_hours.is_kernel("graph_3_cpp_fused_gelu_1")
    assert not paper_hours.is_kernel("CompiledFunction")


def test_a_step_is_timed_eagerly_where_it_cannot_be_recorded():
    """--capture times the recorded step on CUDA only; on a CPU the eager step is timed, and said so."""
    run = assembly.assemble(None, ["method=looped", "task.name=parity", "task.train_max=4", "model.d_model=16",
                                   "model.n_layer=1", "model.n_head=2", "train.device=cpu"])
    cost = paper_hours.step_cost(run, torch.device("cpu"), 1, 2, capture=True)
    assert "captured" not in cost and cost["seconds"] > 0 and cost["flops"] > 0 and cost["ops"] > 100


@pytest.mark.slow  # compiles a block
def test_compiled_blocks_are_one_launch_each_with_graphs(monkeypatch):
    from lengthgen.model import narrow_attention
    monkeypatch.setattr(narrow_attention, "enabled", False)  # else heads this narrow on one thread stay eager
    torch._dynamo.reset()
    cfg = assembly.load(None, ["method=looped", "task.name=parity", "task.train_max=4", "model.d_model=16",
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


def test_a_run_spends_its_steps_at_lengths_as_its_curriculum_draws_them():
    cfg = assembly.load(None, ["method=looped", "task.name=parity", "task.train_min=1", "task.train_max=4",
                              "train.steps=100", "data.curriculum_start=2", "data.curriculum_interval=30",
                              "data.length_sampling=per_batch"])
    weights = narrow_benchmark.steps_per_length(cfg)
    # steps 0-29: max 2 (1 and 2 equally), 30-59: max 3, 60-99: max 4
    assert weights[1] == pytest.approx(30 / 2 + 30 / 3 + 40 / 4)
    assert weights[3] == pytest.approx(30 / 3 + 40 / 4) and weights[4] == pytest.approx(40 / 4)
    assert sum(weights.values()) == pytest.approx(100) and set(weights) == {1, 2, 3, 4}


AUTHORS = Path(__file__).resolve().parent.parent / ".authors" / "looped-tf"


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(not (AUTHORS / "src").is_dir(),
                    reason="the authors' looped-tf is not prepared here (.authors/: benchmarks/authors_looped.py)")
def test_the_authors_looped_step_runs_on_their_code():
    import authors_looped
    assert authors_looped.authors_available(AUTHORS) is None
    assert "not found" in authors_looped.authors_available(AUTHORS.parent / "nowhere")
    assert authors_looped.authors_step_ms(AUTHORS, task="parity", device="cpu", steps=1, warmup=0, length=2) > 0


@pytest.mark.slow  # starts processes
def test_the_gpu_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/gpu.py --device cpu: the same code a GPU runs (steppers, several processes,
    the schemes against RoPE), small, so the GPU's benchmark stays alive without a GPU."""
    import json
    import subprocess
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(Path(__file__).resolve().parent.parent / "benchmarks" / "gpu.py"),
                           "--device", "cpu", "--steps", "1", "--warmup", "0", "--procs", "1,2", "--seconds", "1",
                           "--no-compile", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["looped"]["parity"]["eager"] > 0 and results["looped"]["addition"]["eager"] > 0
    assert set(results["several"]) == {"1", "2"} and all(rate > 0 for rate in results["several"].values())
    assert {"rope", "tra", "cope", "fox"} <= set(results["content"])
    assert "| parity |" in done.stdout and "x RoPE" in done.stdout
    stacked = results["stacked"]["parity"]  # three seeds as one model: each seed's losses its own run's
    assert stacked["seeds"] == 3 and stacked["stacked"] > 0 and stacked["loss_rel"] < 1e-4


@pytest.mark.parametrize("preset", ["core/parity-ntp", "looped/cpu/parity"])
def test_the_cpu_benchmarks_fast_step_is_the_eager_step(monkeypatch, preset):
    """benchmarks/cpu_presets.py: the padded fixed-shape loss, clipping and fused AdamW (here not
    compiled, so the test compiles nothing) update the weights as the trainer's eager step does."""
    import cpu_presets
    monkeypatch.setattr(cpu_presets, "compiled_whole", lambda model, loss: loss)
    tiny = ["model.d_model=16", "model.n_head=2", "model.n_layer=1", "train.batch_size=8", "task.train_max=5"]
    case = cpu_presets.Case(preset, tiny)
    assert case.fixed and "yes" in case.losses_agree(case.batch())
    for _ in range(2):
        batch = case.batch()
        assert torch.allclose(case.eager(batch), case.whole(batch), rtol=1e-5)
    for a, b in zip(case.eager_state.model.parameters(), case.whole_state.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_cpu_benchmark_times_a_model_without_a_fixed_shape_loss_eagerly(monkeypatch, capsys):
    import cpu_presets
    monkeypatch.setitem(cpu_presets.CASES, "tiny", ("chomsky/cpu/reverse_string", [
        "method=stack-rnn", "model.causal=true", "model.d_model=16", "train.batch_size=4", "task.train_max=3"]))
    cpu_presets.main(["--steps", "1", "--cases", "tiny"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |"))
    assert "chomsky/cpu/reverse_string" in row and "no fixed-shape loss" in row
    with pytest.raises(SystemExit):
        cpu_presets.main(["--cases", "nonexistent"])
