"""One writer per output folder for `export`, `report` and `reproduce --out`, beside the tests of
`train` and `eval` (test_concurrency.py): a second writer of any kind that starts while the first
is writing is refused in one line naming the first, in both orders, and the folder holds the first
one's files alone. The second writer is started in the middle of the first one's write (in this
process: a lock is per open file), so every order is met every time; the last tests race two real
processes, repeatedly, and check that whatever the timing nothing is mixed."""
from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exports import trained
from lengthgen.cli import main
from lengthgen.evaluation import evaluate
from lengthgen.export import export
from lengthgen.reporting import report
from lengthgen.reproduction import runner
from tests.helpers.tiny_runs import error_lines
from tests.helpers.toy_papers import positions_grid, toy_paper, toy_preset


@pytest.fixture(scope="module")
def runs(tmp_path_factory, one_thread) -> Path:
    """Two finished, evaluated tiny runs (rope and alibi) and a reproduced toy paper (its runs kept,
    so that a reproduction into the same --out writes its report without training)."""
    root = tmp_path_factory.mktemp("writers")
    for name in ("rope", "alibi"):
        trained(root, name, f"model.position={name}")
        assert main(["eval", str(root / name), "--no-progress"]) == 0
    toy_paper(root / "paper", positions_grid("Writers"), {"parity": toy_preset(steps=10, samples=8)})
    assert main(["reproduce", str(root / "paper"), "--out", str(root / "repro"), "--workers", "1", "--no-progress"]) == 0
    return root


def during(monkeypatch, module, name: str, second) -> list:
    """Call `second` once, from inside the first writer's `module.name` (while it holds its lock);
    its (exit code, stderr) are kept apart from the first writer's."""
    real, results = getattr(module, name), []

    def first_writing(*args, **kwargs):
        if not results:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                results.append((second(), err.getvalue()))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, first_writing)
    return results


def export_of(runs: Path, name: str, out: Path, *flags: str):
    return lambda: main(["export", str(runs / name), "--out", str(out), *flags])


def report_of(runs: Path, name: str, out: Path):
    return lambda: main(["report", str(runs / name), "--out", str(out)])


def reproduce_into(runs: Path, out: Path):
    return lambda: main(["reproduce", str(runs / "paper"), "--out", str(out), "--workers", "1", "--no-progress"])


def refused(results: list) -> str:
    """The second writer's one line: exit 2, naming the first writer's process."""
    [(code, err)] = results
    lines = error_lines(err)
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "is in use by pid" in lines[0] and "lengthgen" in lines[0], lines[0]
    return lines[0]


def export_is_whole(out: Path, run: str) -> None:
    """Every file of the export is the one its mark lists (one export's files, none mixed in)."""
    mark = json.loads((out / "lengthgen_export.json").read_text())
    assert mark["run"] == run and json.loads((out / "config.json").read_text())["lengthgen_export"]["run"] == run
    on_disk = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir() if p.name != "lengthgen_export.json"}
    assert on_disk == mark["sha256"]
    assert f"lengthgen run {run})" in (out / "README.md").read_text()


def report_is_whole(out: Path, runs: set[str]) -> None:
    """report.md and results.csv of one report, of the runs named `runs`."""
    rows = result_rows(out)
    assert rows and {r["run"] for r in rows} == runs
    assert f"{len(runs)} runs, {len(rows)} result rows" in (out / "report.md").read_text()


def result_rows(out: Path) -> list[dict]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


REPRODUCED = {"parity-nope-s0", "parity-rope-s0"}  # the toy paper's runs


@pytest.mark.parametrize("first,second", [("rope", "alibi"), ("alibi", "rope")])
def test_two_exports_into_one_out(runs, tmp_path, monkeypatch, first, second):
    out = tmp_path / "mix"
    results = during(monkeypatch, export, "write_folder", export_of(runs, second, out))
    assert export_of(runs, first, out)() == 0
    refused(results)
    export_is_whole(out, first)
    assert not list(tmp_path.glob(".*.tmp")) and not list(tmp_path.glob(".*.lock"))


def test_export_force_and_eval_of_the_export_exclude_each_other(runs, tmp_path, monkeypatch):
    """Issue 4's race: an evaluation of an export while `export --force` replaces it, both orders."""
    out = tmp_path / "race"
    assert export_of(runs, "rope", out)() == 0
    before = (out / "model.safetensors").read_bytes()
    results = during(monkeypatch, evaluate, "evaluate_held", export_of(runs, "alibi", out, "--force"))
    assert main(["eval", str(out), "--lengths", "3", "--no-progress"]) == 0
    refused(results)
    assert (out / "model.safetensors").read_bytes() == before and (out / "eval.csv").is_file()
    monkeypatch.undo()
    (out / "eval.csv").unlink()  # (else --force refuses it: test_export_faults.py)
    results = during(monkeypatch, export, "write_folder", lambda: main(["eval", str(out), "--lengths", "3", "--no-progress"]))
    assert export_of(runs, "alibi", out, "--force")() == 0
    refused(results)
    export_is_whole(out, "alibi")
    assert not (out / "eval.csv").exists()


@pytest.mark.parametrize("first,second", [("rope", "alibi"), ("alibi", "rope")])
def test_two_reports_into_one_out(runs, tmp_path, monkeypatch, first, second):
    out = tmp_path / "report"
    results = during(monkeypatch, report, "write_held", report_of(runs, second, out))
    assert report_of(runs, first, out)() == 0
    refused(results)
    report_is_whole(out, {first})


@pytest.mark.parametrize("other", ["report", "export"])
def test_a_reproduction_and_another_writer_of_its_out(runs, tmp_path, monkeypatch, other):
    """Both orders: the other writer starts while the reproduction writes its report, and the
    reproduction starts while the other writes."""
    out = tmp_path / "repro"
    shutil.copytree(runs / "repro", out)
    second = report_of(runs, "rope", out) if other == "report" else export_of(runs, "rope", out, "--force")
    results = during(monkeypatch, runner, "write_results", second)
    assert reproduce_into(runs, out)() == 0
    refused(results)
    report_is_whole(out, REPRODUCED)
    monkeypatch.undo()
    mine = tmp_path / "mine"
    writing = (report, "write_held") if other == "report" else (export, "write_folder")
    results = during(monkeypatch, *writing, reproduce_into(runs, mine))
    assert (report_of(runs, "rope", mine) if other == "report" else export_of(runs, "rope", mine))() == 0
    refused(results)
    assert not (mine / "runs").exists()
    report_is_whole(mine, {"rope"}) if other == "report" else export_is_whole(mine, "rope")


# -- two real processes at once, repeated ------------------------------------------------------------------

def race(argvs: list[list[str]], cwd: Path) -> list[tuple[int, str]]:
    """Start every `lengthgen` call at once; (exit code, stderr) of each."""
    procs = [subprocess.Popen([sys.executable, "-m", "lengthgen", *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    return [(p.wait(timeout=300), p.stderr.read()) for p in procs]


def one_won(results: list[tuple[int, str]]) -> None:
    """No traceback; each exit 0 or refused in one line naming the other; at least one wrote."""
    for code, err in results:
        assert "Traceback" not in err and code in (0, 2), err
        if code == 2:
            assert "is in use by pid" in err or "exists" in err, err
    assert any(code == 0 for code, _ in results)


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(2))
def test_two_export_processes_never_mix(runs, tmp_path, attempt):
    names = ["rope", "alibi"] if attempt % 2 == 0 else ["alibi", "rope"]  # both orders of starting
    out = tmp_path / "mix"
    results = race([["export", str(runs / n), "--out", str(out), "--force"] for n in names], tmp_path)
    one_won(results)
    export_is_whole(out, json.loads((out / "lengthgen_export.json").read_text())["run"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder, no lock left


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(2))
def test_two_report_processes_never_mix(runs, tmp_path, attempt):
    names = ["rope", "alibi"] if attempt % 2 == 0 else ["alibi", "rope"]
    out = tmp_path / "report"
    one_won(race([["report", str(runs / n), "--out", str(out)] for n in names], tmp_path))
    report_is_whole(out, {result_rows(out)[0]["run"]})


@pytest.mark.slow
def test_a_reproduction_and_a_report_process_never_mix(runs, tmp_path):
    out = tmp_path / "repro"
    shutil.copytree(runs / "repro", out)
    results = race([["reproduce", str(runs / "paper"), "--out", str(out), "--workers", "1", "--no-progress"],
                    ["report", str(runs / "rope"), "--out", str(out)]], tmp_path)
    one_won(results)
    report_is_whole(out, REPRODUCED if result_rows(out)[0]["run"] in REPRODUCED else {"rope"})
