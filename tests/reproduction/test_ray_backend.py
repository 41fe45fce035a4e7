"""`reproduce --backend ray` on a real local Ray instance: the runs of a toy grid as Ray tasks,
one failing on purpose, an interrupted one resumed, finished ones skipped on a rerun, and the
report the local process pool writes for the same grid."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import RunsFailed
from lengthgen.reproduction import grid as grids
from lengthgen.reproduction import planning
from lengthgen.reproduction import runner as rp
from lengthgen.reproduction.ray_runner import RAY_MISSING, resources
from lengthgen.reproduction.request import ReproduceRequest
from lengthgen.runtime import checkpoint
from lengthgen.training.trainer import train
from tests.helpers.in_process import run_all_here
from tests.helpers.toy_papers import positions_grid, toy_paper, toy_preset

PRESET = toy_preset(lengths="2,12")

GRID = positions_grid("A toy grid", """[arms.learned]
set = {"model.position" = "learned", "model.max_positions" = 64}
[arms.short_table]
description = "a learned table too short for test length 12 (14 tokens): its evaluation fails"
set = {"model.position" = "learned", "model.max_positions" = 12}""")
ARMS = ["nope", "rope", "learned", "short_table"]


@pytest.fixture
def paper(tmp_path) -> Path:
    return toy_paper(tmp_path / "toy", GRID, {"parity": PRESET})


def reproduce(paper: Path, out: Path, **kwargs) -> Path:
    """The report of the grid, whose short_table run fails (the others are reported: RunsFailed's report)."""
    with pytest.raises(RunsFailed, match="1 of 4 runs failed") as failed:
        rp.reproduce(str(paper), ReproduceRequest(scale="cpu", seeds=1, tasks=["parity"], arms=ARMS, out=out, workers=2,
                                                  threads=1, progress=False, **kwargs))
    return failed.value.report


class Stop(Exception):
    pass


def interrupted_run(paper: Path, out: Path, arm: str, monkeypatch) -> Path:
    """The run of `arm` stopped after its checkpoint of step 10 (of 20), as a kill leaves it."""
    (job,) = [j for j in planning.plan(grids.find(str(paper)), ReproduceRequest(scale="cpu", tasks=["parity"], arms=[arm],
                                                                             seeds=1, out=out, workers=2, threads=1))]
    real_save = checkpoint.save

    def stop_after_10(folder, step, *args, **kwargs):
        if step > 10:
            raise Stop
        return real_save(folder, step, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "save", stop_after_10)
        with pytest.raises(Stop):
            train(new_run_config(job.preset, job.overrides), Path(job.folder), progress=False)
    return Path(job.folder)


def same_text(a: Path, b: Path, name: str) -> tuple[str, str]:
    """`name` of both reports, each one's folder written as OUT (the command and the failure name it)."""
    return (a / name).read_text().replace(str(a), "OUT"), (b / name).read_text().replace(str(b), "OUT")


@pytest.mark.slow
def test_ray_runs_a_grid_like_the_local_pool(paper, tmp_path, ray_instance, monkeypatch):
    on_ray, local = tmp_path / "on-ray", tmp_path / "local"
    resumed = interrupted_run(paper, on_ray, "rope", monkeypatch)
    started = (resumed / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in started] == [10, 20]  # logged past the checkpoint of 10

    report = reproduce(paper, on_ray, backend="ray")
    text = report.read_text()
    # the run with the short table fails at evaluation; the other three finish and are reported
    assert "1 run(s) failed" in text and "parity-short_table-s0" in (on_ray / "failures.txt").read_text()
    assert "max_positions" in text
    ran = {name: on_ray / "runs" / f"parity-{name}-s0" for name in ARMS}
    assert all((ran[name] / "eval.done").is_file() for name in ("nope", "rope", "learned"))
    # the interrupted run went on from its checkpoint: the line of step 10 is the one it wrote then
    lines = (resumed / "metrics.jsonl").read_text().splitlines()
    assert lines[0] == started[0] and [json.loads(line)["step"] for line in lines] == [10, 20]
    timing = dict(line.split(",", 1) for line in (on_ray / "timing.csv").read_text().splitlines()[1:])
    assert set(timing) == {f"parity-{name}-s0" for name in ARMS} and timing["parity-short_table-s0"].startswith("False,")

    # a rerun skips the finished runs (their files are not written again) and reports the failure again
    stamps = {name: ((ran[name] / "eval.done").stat().st_mtime_ns,
                     (ran[name] / "checkpoints" / "latest").stat().st_mtime_ns) for name in ("nope", "rope", "learned")}
    again = reproduce(paper, on_ray, backend="ray").read_text()
    assert stamps == {name: ((ran[name] / "eval.done").stat().st_mtime_ns,
                             (ran[name] / "checkpoints" / "latest").stat().st_mtime_ns) for name in stamps}
    assert again == text

    # the local pool, from scratch, writes the same report and results (the same weights: threads=1 both;
    # its runs in this process, as its workers would run them: tests/reproduction/test_reproduce.py)
    monkeypatch.setattr(rp, "run_all", run_all_here)
    reproduce(paper, local)
    assert (on_ray / "results.csv").read_text() == (local / "results.csv").read_text()
    ray_md, local_md = same_text(on_ray, local, "report.md")
    assert "    lengthgen reproduce" in ray_md and ray_md == local_md
    assert {p.name for p in on_ray.iterdir()} == {p.name for p in local.iterdir()} | {"presets"}


def test_resource_requests():
    assert resources("cpu", threads=4, cluster_gpus=8, gpus_per_job=None) == {"num_gpus": 0, "num_cpus": 4}
    assert resources("auto", threads=4, cluster_gpus=0, gpus_per_job=None) == {"num_gpus": 0, "num_cpus": 4}
    assert resources("auto", threads=4, cluster_gpus=2, gpus_per_job=None) == {"num_gpus": 1, "num_cpus": 1}
    assert resources("cuda:1", threads=4, cluster_gpus=0, gpus_per_job=0.5) == {"num_gpus": 0.5, "num_cpus": 1}


def test_without_ray_the_backend_is_a_one_line_error(paper, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # as on a machine without the extra
    out = tmp_path / "out"
    assert main(["reproduce", str(paper), "--backend", "ray", "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"lengthgen: error: {RAY_MISSING}\n"
    assert RAY_MISSING == "--backend ray needs Ray: pip install 'lengthgen[ray]'"
    assert not out.exists()


@pytest.mark.parametrize("flags, needle", [
    (["--address", "auto"], "options of --backend ray"),
    (["--gpus-per-job", "1"], "options of --backend ray"),
    (["--backend", "ray", "--gpus-per-job", "-1"], "--gpus-per-job must be a finite number >= 0"),
    (["--backend", "slurm"], "invalid choice: 'slurm'"),
])
def test_bad_backend_flags_are_refused_before_any_run(paper, tmp_path, capsys, flags, needle):
    argv = ["reproduce", str(paper), "--out", str(tmp_path / "out"), "--no-progress", *flags]
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusal of a choice it does not know
        code = stop.code
    assert code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ray_workers_import_a_runs_plugin(paper, tmp_path, ray_instance, registries):
    """A plugin scheme given to reproduce is recorded in each run's config and imported by the Ray
    workers, which start with nothing of it loaded."""
    plugin = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "half_rope.py"
    out = tmp_path / "out"
    report = rp.reproduce(str(paper), ReproduceRequest(scale="cpu", seeds=1, tasks=["parity"], arms=["nope"], out=out,
                                                       workers=1, threads=1, progress=False,
                                                       overrides=["model.position=half_rope"], plugins=[str(plugin)],
                                                       backend="ray"))
    run = out / "runs" / "parity-nope-s0"
    assert (run / "eval.done").is_file() and f'plugins = ["{plugin}"]' in (run / "config.toml").read_text()
    assert "--plugin" in report.read_text() and "half_rope" in (out / "results.csv").read_text()
