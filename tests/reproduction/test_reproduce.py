"""`lengthgen reproduce`: a grid of runs in worker processes, skipping finished runs,
reporting failed ones without stopping the others."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import to_toml
from lengthgen.errors import ConfigError, RunsFailed, UserError
from lengthgen.results.rows import read_rows
from lengthgen.reproduction import grid as grids
from lengthgen.reproduction import planning
from lengthgen.reproduction import runner as rp
from lengthgen.reproduction.jobs import run_job
from lengthgen.reproduction.request import ReproduceRequest
from tests.helpers.in_process import run_all_here
from tests.helpers.toy_papers import toy_preset

def looped_preset(task: str, model: str, lengths: str) -> str:
    return toy_preset(task, "looped", steps=30, lengths=lengths, model=model)


GRID = """
title = "A toy paper"
seeds = 1
[tasks.parity]
[tasks.copy]
[tasks.parity.arms.looped]
stops = ["oracle", "confidence", "confidence-per-sample"]
per_step = true
[arms.looped]
set = {method = "looped"}
stops = ["oracle"]
[arms.ntp]
set = {method = "ntp"}
multiply = {"model.n_layer" = 2}
[arms.looped-wo-injection]
default = false
set = {method = "looped-wo-injection"}
[scales.cpu]
"""


@pytest.fixture
def experiments(tmp_path, monkeypatch):
    root = tmp_path / "experiments"
    (root / "looped" / "cpu").mkdir(parents=True)
    (root / "looped" / "grid.toml").write_text(GRID)
    (root / "looped" / "cpu" / "parity.toml").write_text(looped_preset("parity", "", "2:6:2"))
    # copy with a learned position table too small for its longest test length: evaluation fails
    (root / "looped" / "cpu" / "copy.toml").write_text(looped_preset(
        "copy", 'position = "learned"\nmax_positions = 12', "2,8"))
    monkeypatch.setattr(grids, "ROOT", root)
    return root


def plan(tasks, arms, seeds, out, workers, **kw):
    request = ReproduceRequest(scale="cpu", tasks=tasks, arms=arms, seeds=seeds, out=out, workers=workers, **kw)
    return planning.plan(grids.find("looped"), request)


def test_arm_overrides_set_then_multiply(experiments):
    g = grids.find("looped")
    sets = grids.arm_overrides(g, "cpu", "parity", "ntp", {})
    assert sets == ['method="ntp"', "model.n_layer=2"]
    cfg = new_run_config(experiments / "looped" / "cpu" / "parity.toml", sets)
    assert (cfg.method, cfg.model.n_layer) == ("ntp", 2)


def test_plan_names_runs_by_value(experiments, tmp_path):
    jobs = plan(["parity"], ["looped", "ntp"], 2, tmp_path / "out", workers=2)
    assert [j.folder.rsplit("/", 1)[1] for j in jobs] == ["parity-looped-s0", "parity-looped-s1",
                                                          "parity-ntp-s0", "parity-ntp-s1"]
    assert jobs[0].stops == ["oracle", "confidence", "confidence-per-sample"] and jobs[0].per_step
    assert jobs[2].stops == [] and not jobs[2].per_step
    assert "train.model_seed=1" in jobs[1].overrides and "data.seed=1" in jobs[1].overrides
    assert jobs[0].threads == max(1, (os.cpu_count() or 1) // 2)
    # labels: the arm, and the config keys that differ between the task's runs over every declared arm
    assert jobs[0].labels == {"arm": "looped", "model.n_layer": 1} and jobs[2].labels == {"arm": "ntp", "model.n_layer": 2}
    jobs1 = plan(["parity"], ["ntp"], 1, tmp_path / "out", workers=1, threads=1)
    assert jobs1[0].threads == 1 and new_run_config(jobs1[0].preset, jobs1[0].overrides).train.threads == 1
    jobs = plan(["parity"], ["ntp"], 1, tmp_path / "out", workers=2, overrides=["train.precision=bf16"])
    cfg = new_run_config(jobs[0].preset, jobs[0].overrides)
    assert (cfg.method, cfg.train.precision) == ("ntp", "bf16")
    with pytest.raises(ConfigError, match="train.precison"):  # a bad --set fails before any run starts
        plan(["parity"], ["ntp"], 1, tmp_path / "out", workers=2, overrides=["train.precison=bf16"])


@pytest.mark.slow
def test_reproduce_runs_skips_and_reports_failures(experiments, tmp_path, monkeypatch):
    out = tmp_path / "out"
    betas = "optim.betas=[0.9, 0.999]"  # the default, with a space the printed command must quote
    with pytest.raises(RunsFailed, match=r"2 of 4 runs failed") as failed:  # exit code 1, the report still written
        rp.reproduce("looped", ReproduceRequest(scale="cpu", seeds=1, tasks=["parity", "copy"], arms=["looped", "ntp"],
                                                out=out, workers=2, samples=8, progress=False, overrides=[betas]))
    report = failed.value.report
    assert failed.value.exit_code == 1 and report == out / "report.md" and "reports the other 2" in str(failed.value)
    text = report.read_text()
    command = next(line for line in text.splitlines() if line.startswith("    lengthgen reproduce"))
    assert shlex.split(command) == ["lengthgen", "reproduce", "looped", "--scale", "cpu", "--seeds", "1",
                                    "--tasks", "parity,copy", "--arms", "looped,ntp", "--out", str(out),
                                    "--samples", "8", "--set", betas]
    # copy's runs fail at evaluation (length 8 exceeds the position table); parity's succeed
    assert "2 run(s) failed" in text and "max_positions" in text
    assert "copy-looped-s0" in (out / "failures.txt").read_text()
    assert "### parity" in text and "looped, oracle stop" in text and "ntp" in text
    assert "looped, confidence stop" in text and (out / "accuracy_vs_iteration.png").is_file()
    assert (out / "accuracy_vs_length.png").is_file() and (out / "results.csv").is_file()
    first = dict(line.split(",", 1) for line in (out / "timing.csv").read_text().splitlines()[1:])
    assert set(first) == {"parity-looped-s0", "parity-ntp-s0", "copy-looped-s0", "copy-ntp-s0"}
    assert first["parity-looped-s0"].startswith("True,") and first["copy-ntp-s0"].startswith("False,")
    # a second call skips the finished runs: their files are not rewritten
    done = out / "runs" / "parity-looped-s0" / "eval.done"
    ckpt = out / "runs" / "parity-looped-s0" / "checkpoints" / "latest"
    stamps = done.stat().st_mtime_ns, ckpt.stat().st_mtime_ns
    with monkeypatch.context() as patch:  # ... and in this process: no worker is started to find nothing to do
        patch.setattr(rp, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("a worker started"))
        rp.reproduce("looped", ReproduceRequest(scale="cpu", seeds=1, tasks=["parity"], arms=["looped"], out=out,
                                                workers=1, samples=8, progress=False))
    assert (done.stat().st_mtime_ns, ckpt.stat().st_mtime_ns) == stamps
    # the skipped run keeps the seconds measured when it was trained; the other rows stay
    second = dict(line.split(",", 1) for line in (out / "timing.csv").read_text().splitlines()[1:])
    assert second == first
    # another config into the same folder is refused and reported, the finished run is kept (its run_job
    # called here: a worker would load torch for seconds to refuse it the same way)
    with pytest.raises(RunsFailed, match=r"every run failed \(1\)"), monkeypatch.context() as patch:
        patch.setattr(rp, "run_all", run_all_here)
        rp.reproduce("looped", ReproduceRequest(scale="cpu", seeds=1, tasks=["parity"], arms=["looped"], out=out,
                                                workers=1, progress=False, overrides=["optim.lr=0.01"]))
    assert "another config (optim.lr is 0.0003 there, 0.01 here)" in (out / "failures.txt").read_text()
    assert (done.stat().st_mtime_ns, ckpt.stat().st_mtime_ns) == stamps


def test_a_selection_of_no_run_says_so(experiments, tmp_path, no_runs):
    """Tasks that run only other arms: no run, said as such (not "every run failed")."""
    with pytest.raises(UserError, match=r"select no run of sparsity \(unique_set runs ppc, coupled, rope_pose, nope\)"):
        rp.reproduce(str(Path(__file__).parents[2] / "experiments" / "sparsity"),
                     ReproduceRequest(scale="cpu", seeds=1, tasks=["unique_set"], arms=["random_start"],
                                      out=tmp_path / "out", workers=1, progress=False))
    assert not (tmp_path / "out").exists()


def test_bad_arguments(experiments, tmp_path):
    with pytest.raises(UserError, match="unknown task 'sorting'"):
        rp.reproduce("looped", ReproduceRequest(tasks=["sorting"], out=tmp_path))
    with pytest.raises(UserError, match="unknown arm"):
        rp.reproduce("looped", ReproduceRequest(arms=["lstm"], out=tmp_path))
    with pytest.raises(UserError, match="unknown paper"):
        rp.reproduce("transformers", ReproduceRequest(out=tmp_path))
    with pytest.raises(UserError, match="unknown scale"):
        rp.reproduce("looped", ReproduceRequest(scale="tpu", out=tmp_path))


@pytest.fixture
def no_runs(monkeypatch):
    """Fail at once if a reproduction gets as far as starting its worker processes."""
    monkeypatch.setattr(rp, "ProcessPoolExecutor", lambda *a, **k: pytest.fail("runs started"))


@pytest.mark.parametrize("flags, needle", [
    (["--tasks", ","], "--tasks names no task"),
    (["--arms", ","], "--arms names no arm"),
    (["--samples", "-1"], "--samples must be >= 1"),
    (["--seeds", "0"], "--seeds and --workers must be >= 1"),
    (["--workers", "0"], "--seeds and --workers must be >= 1"),
    (["--threads", "-1"], "--threads >= 0"),
    (["--set", "train.model_seed=7"], "use --seeds"),
    (["--set", "data.seed=7"], "use --seeds"),
    (["--set", " train.threads = 1"], "use --threads"),
    (["--set", "train={model_seed=5, threads=3}"], "use --seeds"),
    (["--stack-seeds", "--backend", "ray"], "--stack-seeds is an option of the local backend"),
], ids=["no-task", "no-arm", "samples", "seeds", "workers", "threads", "model-seed", "data-seed", "threads-set",
        "inline-table", "stack-on-ray"])
def test_bad_flags_are_refused_before_any_run(experiments, tmp_path, no_runs, capsys, flags, needle, monkeypatch):
    """The command checks its flags (lengthgen.cli.check_reproduce_flags) before a grid is planned."""
    monkeypatch.setattr(grids, "find", lambda *a: pytest.fail("a grid was read"))
    argv = ["reproduce", "looped", "--scale", "cpu", "--tasks", "parity", "--arms", "ntp", "--seeds", "1",
            "--workers", "1", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(argv + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_refused(experiments, tmp_path, no_runs):
    (tmp_path / "out").write_text("notes")
    with pytest.raises(UserError, match="is a file"):
        rp.reproduce("looped", ReproduceRequest(scale="cpu", seeds=1, tasks=["parity"], arms=["ntp"],
                                                out=tmp_path / "out", workers=1, progress=False))


class Planned(Exception):
    pass


def test_a_name_given_twice_is_one_run(experiments, tmp_path, monkeypatch):
    planned = []

    def plan(grid, request):
        planned.append((request.tasks, request.arms))
        raise Planned  # stop before anything runs

    monkeypatch.setattr(planning, "plan", plan)
    with pytest.raises(Planned):
        rp.reproduce("looped", ReproduceRequest(scale="cpu", seeds=1, tasks=["parity", "copy", "parity"],
                                                arms=["ntp", "looped", "ntp"], out=tmp_path / "out", workers=2,
                                                progress=False))
    assert planned == [(("parity", "copy"), ("ntp", "looped"))]


def parity_ntp(out, samples):
    (job,) = plan(["parity"], ["ntp"], 1, out, workers=1, samples=samples, threads=1)
    return job


def test_run_is_evaluated_again_when_settings_change_or_results_are_missing(experiments, tmp_path):
    out = tmp_path / "out"
    folder = out / "runs" / "parity-ntp-s0"
    first = run_job(parity_ntp(out, samples=8))
    assert first["ok"] and not first["skipped"]
    assert run_job(parity_ntp(out, samples=8))["skipped"]
    # other --samples: the old evaluation does not count
    again = run_job(parity_ntp(out, samples=4))
    assert again["ok"] and not again["skipped"]
    assert {r["n"] for r in read_rows(folder / "eval.csv")} == {4}
    assert json.loads((folder / "eval.done").read_text())["samples"] == 4
    # eval.done without eval.csv: evaluated again, not skipped and left out of the report
    (folder / "eval.csv").unlink()
    assert not run_job(parity_ntp(out, samples=4))["skipped"] and (folder / "eval.csv").is_file()
    # an unreadable eval.csv is kept aside and the run evaluated again
    text = (folder / "eval.csv").read_text()
    (folder / "eval.csv").write_text(text[:-5])
    assert not run_job(parity_ntp(out, samples=4))["skipped"]
    assert (folder / "eval.csv.unreadable").read_text() == text[:-5] and read_rows(folder / "eval.csv")


def test_run_folder_without_checkpoint_is_kept_unless_it_holds_nothing(experiments, tmp_path):
    out = tmp_path / "out"
    job = parity_ntp(out, samples=4)
    folder = Path(job.folder)
    (folder / "checkpoints").mkdir(parents=True)  # pruned to save disk; the results stay
    (folder / "config.toml").write_text(to_toml(new_run_config(job.preset, job.overrides)))
    (folder / "eval.csv").write_text("kept\n")
    (folder / "notes.md").write_text("kept\n")
    result = run_job(job)
    assert not result["ok"] and "no checkpoint" in result["error"] and "notes.md" in result["error"]
    assert (folder / "eval.csv").read_text() == (folder / "notes.md").read_text() == "kept\n"
    # what a training killed before its first checkpoint leaves is started afresh
    (folder / "eval.csv").unlink()
    (folder / "notes.md").unlink()
    (folder / "metrics.jsonl").write_text("")
    (folder / "checkpoints" / ".step_00000010.tmp").mkdir()
    assert run_job(job)["ok"] and read_rows(folder / "eval.csv")


def test_reproduce_refuses_bf16_once_before_any_run(experiments, tmp_path, monkeypatch):
    import lengthgen.runtime.devices as devices
    monkeypatch.setattr(devices, "native_bf16", lambda device: False)
    with pytest.raises(UserError, match="native bf16"):
        rp.reproduce("looped", ReproduceRequest(scale="cpu", seeds=1, tasks=["parity"], arms=["looped", "ntp"],
                                                out=tmp_path / "out", workers=1, progress=False,
                                                overrides=["train.precision=bf16"]))
    assert not (tmp_path / "out").exists()


def _children(pid: int) -> set[int]:
    """Live child processes of `pid` (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_killed_reproduction_stops_its_workers(experiments, tmp_path, sig):
    # SIGTERM is handled (the pool is terminated); SIGKILL is not, so each worker watches its parent
    (experiments / "looped" / "cpu" / "parity.toml").write_text(
        looped_preset("parity", "", "2").replace("steps = 30", "steps = 1000000"))
    out = tmp_path / "out"
    driver = ("import sys; from pathlib import Path; from lengthgen.reproduction import runner as rp; "
              "from lengthgen.reproduction.request import ReproduceRequest; "
              "rp.reproduce(sys.argv[1] + '/looped', ReproduceRequest(scale='cpu', seeds=1, tasks=['parity'], "
              "arms=['looped', 'ntp'], out=Path(sys.argv[2]), workers=2, progress=False))")
    proc = subprocess.Popen([sys.executable, "-c", driver, str(experiments), str(out)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        runs = [out / "runs" / f"parity-{m}-s0" / "metrics.jsonl" for m in ("looped", "ntp")]
        deadline = time.monotonic() + 120
        while not all(r.is_file() for r in runs):  # both workers are training
            assert proc.poll() is None and time.monotonic() < deadline, \
                proc.stderr.read() if proc.poll() is not None else "workers did not start"
            time.sleep(0.2)
        workers = _children(proc.pid)
        assert len(workers) >= 2
        proc.send_signal(sig)
        assert proc.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(pid) for pid in workers), "workers outlived the reproduction"
    finally:  # whatever failed, leave nothing training for a million steps
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_the_progress_line_shows_where_each_running_run_is(tmp_path):
    """Read from each running run's training log: its step of its steps, its loss and its latest
    test at the curriculum's maximum; an unfinished last line and a run with no log are skipped."""
    from lengthgen.reproduction.grid import Job
    from lengthgen.reproduction.runner import last_row, live_status

    a, b, c = (tmp_path / name for name in ("parity-looped-s0", "parity-ntp-s0", "copy-ntp-s0"))
    a.mkdir()
    b.mkdir()
    (a / "metrics.jsonl").write_text('{"step": 100, "loss": 0.5}\n{"step": 200, "loss": 0.25, "test@max": 0.875}\n'
                                     '{"step": 300, "lo')
    (b / "metrics.jsonl").write_text("".join(f'{{"step": {s}, "loss": 0.69}}\n' for s in range(1, 2000)))
    jobs = [Job("parity", arm, 0, "p.toml", [], str(folder), config={"train": {"steps": 600}})
            for arm, folder in (("looped", a), ("ntp", b), ("ntp", c))]
    assert last_row(a / "metrics.jsonl")["step"] == 200
    assert live_status(jobs) == "parity-looped-s0 200/600 loss 0.25 acc 0.88 | parity-ntp-s0 1999/600 loss 0.69"


def test_the_job_queued_ahead_of_a_free_worker_is_not_shown_as_running():
    from concurrent.futures import Future

    from lengthgen.reproduction.runner import running_jobs

    futures = {}
    for name in ("done", "first", "second", "queued", "waiting"):
        future = Future()
        if name != "waiting":
            future.set_running_or_notify_cancel()  # what the pool does to the jobs it hands out
        futures[future] = name
    done = next(iter(futures))
    done.set_result(None)
    pending = set(futures) - {done}
    assert running_jobs(futures, pending, workers=2) == ["first", "second"]


def test_stacked_seeds_reproduce_the_runs_trained_one_by_one(experiments, tmp_path, monkeypatch):
    """--stack-seeds: each configuration's seeds train as one stacked model in one worker; the
    runs' results are those of training them one by one (lengthgen.accel.stacked). The runs one by
    one train here, in this process (run_job as a worker calls it), which saves starting a worker for
    them; both ways on one thread (--threads 1), as a worker beside a busy one would."""
    apart, stacked = tmp_path / "apart", tmp_path / "stacked"
    kw = dict(seeds=2, tasks=["parity"], arms=["looped", "ntp"], workers=1, threads=1, samples=8, progress=False)
    with monkeypatch.context() as patch:
        patch.setattr(rp, "run_all", run_all_here)
        rp.reproduce("looped", ReproduceRequest(scale="cpu", out=apart, **kw))
    assert len(rp.seed_groups(plan(["parity"], ["looped", "ntp"], 2, stacked, 1))) == 2  # two arms, each two seeds
    rp.reproduce("looped", ReproduceRequest(scale="cpu", out=stacked, stack_seeds=True, **kw))
    for name in ("parity-looped-s0", "parity-looped-s1", "parity-ntp-s0", "parity-ntp-s1"):
        losses = [[json.loads(line)["loss"] for line in (out / "runs" / name / "metrics.jsonl").open()]
                  for out in (apart, stacked)]
        assert losses[0] == pytest.approx(losses[1], rel=1e-4), name
        last = [json.loads((out / "runs" / name / "metrics.jsonl").read_text().splitlines()[-1]) for out in (apart, stacked)]
        assert "stacked_seeds" not in last[0] and last[1]["stacked_seeds"] == 2
    rows = [{(r["run"], r["length"]): r["accuracy"] for r in read_rows(out / "results.csv")} for out in (apart, stacked)]
    assert rows[0].keys() == rows[1].keys() and rows[0] == pytest.approx(rows[1], abs=0.13)  # one of 8 samples
