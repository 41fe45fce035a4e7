"""The benchmarks (benchmarks/README.md), run small on a CPU so that CI keeps them alive: the shared
clock (benchmarks/common/timing.py: turns, warm-up, median and spread, on a fake clock), the records
(benchmarks/common/records.py: the naming rule), the trainer's own step as every script takes it
(benchmarks/common/steps.py); benchmarks/estimates/paper_hours.py --compile: the kernel and launch
counts its GPU estimate rests on; benchmarks/decisions/narrow_attention.py: the steps a run spends
at each length, which weigh its whole-run time; benchmarks/speed/gpu.py and cpu_presets.py on a CPU."""
from __future__ import annotations

import argparse
import ast
import datetime
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

from lengthgen.accel import compiling
from lengthgen.assembly.runs import new_run, new_run_config
from lengthgen.methods.registry import get_method
from lengthgen.tasks import task_of

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(ROOT))  # benchmarks/ is a package of the checkout, not of the install
from benchmarks.common import records, timing  # noqa: E402
from benchmarks.decisions import narrow_attention as narrow_benchmark  # noqa: E402
from benchmarks.estimates import paper_hours  # noqa: E402

SCRIPTS = sorted(p for p in BENCHMARKS.rglob("*.py") if p.parent.name != "common" and p.name != "__init__.py")


class FakeClock:
    """A clock that only the variants move: each call of a variant advances it by that call's seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def variant(self, seconds: list[float], calls: list, name: str):
        it = iter(seconds)

        def call(*given):
            calls.append((name, given))
            self.now += next(it)
            return name
        return call


def test_the_variants_take_turns_after_warm_up_rounds_in_the_same_order():
    clock, calls = FakeClock(), []
    variants = {name: clock.variant([1.0] * 5, calls, name) for name in "abc"}
    drawn = iter(range(5))
    timings = timing.alternate(variants, rounds=3, warmup=2, clock=clock, draw=lambda: next(drawn))
    assert timings.order == list("abc") * 5 and [name for name, _ in calls] == list("abc") * 5
    # one draw a round, the same value for every variant of the round
    assert [given for _, given in calls] == [(i,) for i in range(5) for _ in "abc"]
    assert timings.warmup == {name: [1.0, 1.0] for name in "abc"}
    assert all(timings[name].n == 3 for name in "abc") and timings.last == {name: name for name in "abc"}


def test_median_and_spread_are_computed_on_the_timed_rounds_only():
    clock, calls = FakeClock(), []
    # warm-up 50 and 60 (a compilation) left out; timed 4, 1, 3, 2, 10 and 2 each
    variants = {"a": clock.variant([50, 4, 1, 3, 2, 10], calls, "a"),
                "b": clock.variant([60, 2, 2, 2, 2, 2], calls, "b")}
    timings = timing.alternate(variants, rounds=5, warmup=1, clock=clock)
    a = timings["a"]
    assert a.samples == [4, 1, 3, 2, 10] and timings.warmup["a"] == [50]
    assert (a.median, a.min, a.max) == (3, 1, 10)
    assert (a.q1, a.q3, a.iqr) == (2, 4, 2)  # numpy's linear quartiles of 1, 2, 3, 4, 10
    assert timings.ratio("a", "b") == pytest.approx(1.5)
    assert timings.paired("a", "b").samples == [2, 0.5, 1.5, 1, 5] and timings.paired("a", "b").median == 1.5
    record = timings.as_dict(1000)
    assert record["a"]["median"] == 3000 and record["a"]["q1"] == 2000 and record["b"]["samples"] == [2000] * 5
    assert timing.quartiles([7.0]) == (7.0, 7.0)


def test_sync_brackets_each_call_and_a_failing_variant_is_dropped_when_asked():
    events = []

    def broken():
        raise RuntimeError("compiling failed\nwith details")

    variants = {"ok": lambda: events.append("call"), "broken": broken}
    timings = timing.alternate(variants, rounds=2, warmup=1, sync=lambda: events.append("sync"), keep_going=True)
    # the broken variant's sync before it raised, in the first round only: then it is dropped
    assert events == ["sync", "call", "sync", "sync"] + ["sync", "call", "sync"] * 2
    assert "ok" in timings and "broken" not in timings
    assert timings.failed == {"broken": "RuntimeError: compiling failed"}
    assert timings.as_dict()["broken"] == {"failed": "RuntimeError: compiling failed"}
    with pytest.raises(RuntimeError):
        timing.alternate(variants, rounds=1)
    with pytest.raises(ValueError):
        timing.alternate(variants, rounds=0)


def test_a_variant_that_times_itself_gives_its_own_seconds():
    timings = timing.alternate({"child": lambda: [0.5, 0.25, 0.75], "one": lambda: 2.0}, rounds=2, warmup=1,
                               returns_seconds=True)
    assert timings["child"].samples == [0.5, 0.25, 0.75] * 2 and timings["child"].median == 0.5
    assert timings["one"].samples == [2.0, 2.0] and timing.time_one(lambda: 1.0, 3, returns_seconds=True).n == 3


def test_a_record_is_named_by_date_script_and_machine_and_never_overwritten(tmp_path):
    day = datetime.date(2026, 12, 7)
    first = records.record_path(BENCHMARKS / "speed/gpu.py", tmp_path, "cpu", day)
    assert first.parent == tmp_path and first.name == f"2026-12-07-gpu-{records.machine_name('cpu')}.json"
    assert records.machine_name("cpu").startswith(f"cpu{records.os.cpu_count()}-")
    first.write_text("{}")
    assert records.record_path(BENCHMARKS / "speed/gpu.py", tmp_path, "cpu", day).name == first.stem + "-2.json"
    assert records.record_path("x.py", tmp_path / "mine.json") == tmp_path / "mine.json"
    args = argparse.Namespace(json=str(tmp_path), no_record=False, note="a smoke run", steps=2)
    written = records.write(str(BENCHMARKS / "speed/gpu.py"), args, {"ms": 1.5})
    saved = json.loads(written.read_text())
    assert saved["script"] == "benchmarks/speed/gpu.py" and saved["args"] == {"steps": 2}
    assert saved["note"] == "a smoke run" and saved["results"] == {"ms": 1.5}
    assert saved["machine"]["cpu_count"] >= 1 and "platform" in saved["machine"]
    args.no_record = True
    assert records.write("x.py", args, {}) is None


def test_every_script_says_what_it_measures_and_names_its_records_uniquely():
    stems = [p.stem for p in SCRIPTS] + [p.stem for p in BENCHMARKS.rglob("*.sh") if p.name != "gpu_check.sh"]
    assert len(stems) == len(set(stems))  # the <script> of a record's name
    for path in SCRIPTS:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and len(doc.splitlines()) >= 3, path
        if path.parent.name == "decisions":  # the choice it settled, with the number
            assert doc.startswith("Decided ") and any(c.isdigit() for c in doc.splitlines()[0]), path
    for path in BENCHMARKS.rglob("*.json"):  # records stay small
        assert path.parent.name == "records" and path.stat().st_size < 200_000, path


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_script_imports(path):
    """The imports of every script hold (the names they take from lengthgen move with it)."""
    module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    assert module.__doc__


def test_the_benchmarks_time_the_trainers_own_step(monkeypatch):
    from benchmarks.common.steps import TrainerStep
    from lengthgen.training import trainer
    updates = []
    real = trainer.update
    monkeypatch.setattr(trainer, "update", lambda *a: (updates.append(1), real(*a)))
    run = new_run(None, ["method=looped", "task.name=parity", "task.train_max=4", "model.d_model=16",
                         "model.n_layer=1", "model.n_head=2", "train.device=cpu", "data.curriculum_start=2",
                         "data.curriculum_interval=5"])
    a, b = TrainerStep(run, "cpu"), TrainerStep(run, "cpu")
    assert a.state.step == 10  # where the curriculum reaches its last length
    batches = a.batches()
    assert float(a(batches)) == float(b(batches)) and updates == [1, 1]
    assert a.state.step == 11 and a.state.model is not b.state.model
    for p, q in zip(a.state.model.parameters(), b.state.model.parameters()):
        assert torch.equal(p, q)  # same weights, same batches: the same step


def test_views_launch_nothing_and_fused_kernels_do():
    assert not paper_hours.is_kernel("aten::view") and not paper_hours.is_kernel("aten::transpose")
    assert paper_hours.is_kernel("aten::mm") and paper_hours.is_kernel("graph_3_cpp_fused_gelu_1")
    assert not paper_hours.is_kernel("CompiledFunction")


def test_a_step_is_timed_eagerly_where_it_cannot_be_recorded():
    """--capture times the recorded step on CUDA only; on a CPU the eager step is timed, and said so."""
    run = new_run(None, ["method=looped", "task.name=parity", "task.train_max=4", "model.d_model=16",
                         "model.n_layer=1", "model.n_head=2", "train.device=cpu"])
    cost = paper_hours.step_cost(run, torch.device("cpu"), 1, 2, capture=True)
    assert "captured" not in cost and cost["seconds"] > 0 and cost["flops"] > 0 and cost["ops"] > 100


@pytest.mark.slow  # compiles a block
def test_compiled_blocks_are_one_launch_each_with_graphs(monkeypatch):
    from lengthgen.accel import narrow_attention
    monkeypatch.setattr(narrow_attention, "enabled", False)  # else heads this narrow on one thread stay eager
    torch._dynamo.reset()
    cfg = new_run_config(None, ["method=looped", "task.name=parity", "task.train_max=4", "model.d_model=16",
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
    cfg = new_run_config(None, ["method=looped", "task.name=parity", "task.train_min=1", "task.train_max=4",
                                "train.steps=100", "data.curriculum_start=2", "data.curriculum_interval=30",
                                "data.length_sampling=per_batch"])
    weights = narrow_benchmark.steps_per_length(cfg)
    # steps 0-29: max 2 (1 and 2 equally), 30-59: max 3, 60-99: max 4
    assert weights[1] == pytest.approx(30 / 2 + 30 / 3 + 40 / 4)
    assert weights[3] == pytest.approx(30 / 3 + 40 / 4) and weights[4] == pytest.approx(40 / 4)
    assert sum(weights.values()) == pytest.approx(100) and set(weights) == {1, 2, 3, 4}


AUTHORS = ROOT / ".authors" / "looped-tf"


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(not (AUTHORS / "src").is_dir(),
                    reason="the authors' looped-tf is not prepared here (.authors/: benchmarks/authors/looped_tf.py)")
def test_the_authors_looped_step_runs_on_their_code():
    from benchmarks.authors import looped_tf as authors_looped
    assert authors_looped.authors_available(AUTHORS) is None
    assert "not found" in authors_looped.authors_available(AUTHORS.parent / "nowhere")
    assert authors_looped.authors_step_ms(AUTHORS, task="parity", device="cpu", steps=1, warmup=0, length=2) > 0


@pytest.mark.slow  # starts processes
def test_the_gpu_benchmark_runs_on_cpu(tmp_path):
    """benchmarks/speed/gpu.py --device cpu: the same code a GPU runs (steppers, several processes,
    the schemes against RoPE), small, so the GPU's benchmark stays alive without a GPU. Each process
    trains 0.1 s (at least one step: a rate above 0), not the 8 s a measurement takes."""
    import subprocess
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "speed" / "gpu.py"),
                           "--device", "cpu", "--steps", "1", "--warmup", "0", "--procs", "1,2", "--seconds", "0.1",
                           "--no-compile", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["script"] == "benchmarks/speed/gpu.py" and record["args"]["steps"] == 1
    results = record["results"]
    assert results["looped"]["parity"]["eager"] > 0 and results["looped"]["addition"]["eager"] > 0
    assert set(results["several"]) == {"1", "2"} and all(rate > 0 for rate in results["several"].values())
    assert {"rope", "tra", "cope", "fox"} <= set(results["content"])
    assert "| parity |" in done.stdout and "x RoPE" in done.stdout
    stacked = results["stacked"]["parity"]  # three seeds as one model: each seed's losses its own run's
    assert stacked["seeds"] == 3 and stacked["stacked"] > 0 and stacked["loss_rel"] < 1e-4


@pytest.mark.parametrize("preset", ["core/parity-ntp", "looped/cpu/parity"])
def test_the_cpu_benchmarks_fast_step_is_the_eager_step(monkeypatch, preset):
    """benchmarks/speed/cpu_presets.py: the padded fixed-shape loss, clipping and fused AdamW (here not
    compiled, so the test compiles nothing) update the weights as the trainer's eager step does."""
    from benchmarks.speed import cpu_presets
    tiny = ["model.d_model=16", "model.n_head=2", "model.n_layer=1", "train.batch_size=8", "task.train_max=5"]
    case = cpu_presets.Case(preset, tiny, compile=False)
    assert case.fixed and "yes" in case.losses_agree(case.batch())
    for _ in range(2):
        batch = case.batch()
        assert torch.allclose(case.eager(batch), case.whole(batch), rtol=1e-5)
    assert case.whole.recorded  # every step took the recorded step's body, none fell back to eager
    for a, b in zip(case.eager_state.model.parameters(), case.whole_state.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_cpu_benchmark_times_a_model_without_a_fixed_shape_loss_eagerly(monkeypatch, capsys, tmp_path):
    from benchmarks.speed import cpu_presets
    monkeypatch.setitem(cpu_presets.CASES, "tiny", ("chomsky/cpu/reverse_string", [
        "method=stack-rnn", "model.causal=true", "model.d_model=16", "train.batch_size=4", "task.train_max=3"]))
    cpu_presets.main(["--steps", "1", "--cases", "tiny", "--json", str(tmp_path / "cpu.json")])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| tiny |"))
    assert "chomsky/cpu/reverse_string" in row and "no fixed-shape loss" in row
    saved = json.loads((tmp_path / "cpu.json").read_text())["results"]["rows"][0]
    assert saved["case"] == "tiny" and saved["eager ms"] > 0 and saved["timings"]["eager"]["n"] == 1
    with pytest.raises(SystemExit):
        cpu_presets.main(["--cases", "nonexistent"])


def test_the_cpu_benchmark_says_when_the_authors_step_cannot_run(capsys, tmp_path):
    from benchmarks.speed import cpu_presets
    cpu_presets.main(["--steps", "1", "--cases", "", "--authors", str(tmp_path / "nowhere"),
                      "--json", str(tmp_path / "cpu.json")])
    out = capsys.readouterr().out
    assert "| parity |" in out and "| addition |" in out and "authors' step not run" in out
    saved = json.loads((tmp_path / "cpu.json").read_text())["results"]
    assert saved["rows"] == [] and [r["task"] for r in saved["authors"]] == ["parity", "addition"]
    assert all("not found" in r["note"] for r in saved["authors"])
