"""The analysis scripts in scripts/ run on real run folders and split their test sets correctly."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lengthgen.cli import main
from tests.helpers.in_process import run_python_file

pytestmark = pytest.mark.slow  # every test runs a script on trained runs
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
TINY = ["--set=model.d_model=16", "--set=model.n_layer=1", "--set=model.n_head=2", "--set=train.batch_size=8",
        "--set=train.steps=10", "--set=train.device=cpu", "--no-progress"]


def run_script(name: str, *args: str, process: bool = False) -> subprocess.CompletedProcess:
    """`python scripts/NAME ARGS...`: in this process (tests/helpers/in_process.py) unless `process`."""
    if process:
        return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True)
    return run_python_file(SCRIPTS / name, *args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    learn = ["--set=train.steps=300", "--set=optim.lr=3e-3"]  # far enough from 0 and 1 for answer_positions
    for name, task, method, extra in [("parity", "parity", "looped", learn), ("mult", "multiplication", "looped", []),
                                      ("mult-ntp", "multiplication", "ntp", []), ("add", "addition", "looped", learn),
                                      ("table", "parity", "ntp", ["--set=model.position=learned",
                                                                  "--set=model.max_positions=16"])]:
        assert main(["train", "--defaults", *TINY, *extra, f"--set=task.name={task}", "--set=task.train_max=4",
                     f"--set=method={method}", "--out", str(root / name)]) == 0
    assert main(["train", "--defaults", *TINY, "--set=task.name=multi_operand_addition", "--set=task.train_max=3",
                 "--set=task.options.coupled=2", "--set=model.position=learned", "--set=model.max_positions=16",
                 "--out", str(root / "sums")]) == 0
    return root


@pytest.mark.parametrize("run", ["mult", "mult-ntp"])
def test_multiplication_by_a_splits_every_sample_into_one_group(runs, run):
    out = run_script("multiplication_by_a.py", str(runs / run), "3", "5")
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    assert [int(r.split()[0]) for r in rows] == [3, 5]
    for row in rows:
        cells = [(float(acc), int(n)) for acc, n in re.findall(r"([\d.]+) \(\s*(\d+)\)", row)]
        (all_acc, total), groups = cells[0], cells[1:]
        assert len(groups) == 6  # a = 0, 1, 00, 01, 10, 11: every value occurs among 2048 samples
        assert sum(n for _, n in groups) == total == 2048
        # the groups partition the samples, so their weighted accuracy is the overall one
        assert sum(acc * n for acc, n in groups) / total == pytest.approx(all_acc, abs=2e-3)


def test_parity_scripts_run_on_a_looped_parity_run(runs):
    out = run_script("parity_by_count.py", str(runs / "parity"), "5", process=True)  # one script run as `python` does
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("length 5: accuracy ")
    out = run_script("confidence_ranks.py", str(runs / "parity"), "3")
    assert out.returncode == 0, out.stderr
    share = float(re.search(r"right step most confident for ([\d.]+) of samples", out.stdout).group(1))
    assert 0 <= share <= 1


def test_halting_probe_reports_where_each_probe_stops(runs):
    out = run_script("halting_probe.py", str(runs / "parity"), "5", "6", "--steps", "30")  # 30: cheap, not fitted
    assert out.returncode == 0, out.stderr
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if re.match(r"\| [a-z]", line)][1:]
    # every probe, at the training maximum, then the lengths asked for
    assert [(r[0].strip(), int(r[1])) for r in rows] == [(p, n) for p in ("mlp", "linear", "mlp+change", "token-min")
                                                         for n in (4, 5, 6)]
    for _, n, at_t, probe, oracle, step in rows:
        assert all(0 <= float(v) <= 1 for v in (at_t, probe, oracle))
        # stopping at T(n) gives the oracle's read-out: the two exact matches differ by no more than the misses
        assert abs(float(probe) - float(oracle)) <= 1 - float(at_t) + 1e-3
        assert 1 <= float(step) <= 2 * int(n)  # within the `halt` rule's window (Parity: T(n) = n)


def test_scratchpad_positions_gives_each_running_sum_its_places(runs):
    out = run_script("scratchpad_positions.py", str(runs / "sums"), "3", "2")
    assert out.returncode == 0, out.stderr
    exact = float(re.search(r"length 2: exact ([\d.]+)", out.stdout).group(1))
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("  s_")]
    assert [r[0] for r in rows] == ["s_0", "s_1", "s_2", "s_3"]  # 3 operands: s_0 .. s_3
    places = [[float(v) for v in r[1:]] for r in rows]
    assert all(len(p) == len(str(3 * 99)) + 1 for p in places)  # W digits and the token that closes the sum
    assert all(exact <= v <= 1 for p in places for v in p)  # a right answer is right at every place


def answer_position_rows(run: Path, *lengths: str) -> list[tuple[int, float, list[float]]]:
    out = run_script("answer_positions.py", str(run), *lengths)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    return [(int(r[0]), float(r[1]), [float(a) for a in r[2:]]) for r in rows]


def test_answer_positions_cover_the_answer_and_bound_the_exact_match(runs):
    rows = answer_position_rows(runs / "add", "3", "5")
    assert [n for n, _, _ in rows] == [3, 5]
    for n, exact, accs in rows:
        assert 0.02 < exact < 0.98  # a partly trained run, so the bounds below can fail
        assert len(accs) == n + 1  # the (n + 1)-bit sum
        assert exact <= min(accs) + 0.005  # an exact answer is right at every position
        assert 1 - exact <= sum(1 - a for a in accs) + 0.005  # a wrong one is wrong at one position at least
    [(n, exact, accs)] = answer_position_rows(runs / "parity", "4")
    assert accs == [pytest.approx(exact, abs=0.005)]  # one answer token: its accuracy is the exact match


@pytest.mark.parametrize("script, args, needle", [
    ("multiplication_by_a.py", ["parity"], "is a 'parity' run"),
    ("multiplication_by_a.py", ["mult", "x"], "usage: multiplication_by_a.py"),
    ("multiplication_by_a.py", ["nowhere"], "does not exist"),
    ("confidence_ranks.py", ["mult-ntp"], "confidence_ranks needs a looped one"),
    ("halting_probe.py", ["mult-ntp"], "halting_probe needs a looped one"),
    ("halting_probe.py", ["parity", "--steps", "x"], "--steps needs a positive integer"),
    ("parity_by_count.py", ["mult"], "is a 'multiplication' run"),
    ("parity_by_count.py", ["parity", "-3"], "usage: parity_by_count.py"),
    ("answer_positions.py", ["nowhere"], "does not exist"),
    ("answer_positions.py", ["add", "0"], "usage: answer_positions.py"),
    ("answer_positions.py", ["add", "\u00b2"], "usage: answer_positions.py"),  # a digit to isdigit, not to int
    ("answer_positions.py", ["add", "100001"], "usage: answer_positions.py"),
    ("answer_positions.py", ["table", "40"], "model.max_positions = 16"),
    ("scratchpad_positions.py", ["add", "3"], "needs a multi_operand_addition one"),
    ("scratchpad_positions.py", ["sums"], "usage: scratchpad_positions.py"),
    ("scratchpad_positions.py", ["sums", "3", "20"], "model.max_positions = 16"),
])
def test_scripts_refuse_bad_input_in_one_line(runs, script, args, needle):
    out = run_script(script, *[str(runs / a) if a in ("parity", "mult", "mult-ntp", "add", "table", "sums", "nowhere")
                               else a for a in args])
    assert out.returncode != 0
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
