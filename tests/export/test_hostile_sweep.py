"""A hostile sweep of the newer commands (issue 73): `export`, the exported model's arguments and
tokenizer, the lm-evaluation-harness model's arguments, `eval` of exports and of loop counts,
`report`, and small Chomsky grids. Each case is what a new user might type; each is expected to
end in a clean one-line error naming the problem, or to run and give a checked result. A case is
counted as a traceback (an exception that is not lengthgen's one-line kind), a hang (past its
time), silent (exit 0 where an error was due, or a result that fails its check), unclear (an error
that is not one line, or names something else), clean or ok. Run it with `-s` to see the table:

    make sweep        (.venv/bin/python -m pytest -m sweep -s tests/export/test_hostile_sweep.py)

It is left out of `make test` (its 116 cases take over a minute, and each item it sweeps has a test
of its own there): run it after changing export, the harness, report or a grid's report.
"""
from __future__ import annotations

import contextlib
import io
import json
import signal
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch

from tests.helpers.documents import lm_overrides, write_documents
from exports import LOOPED, hf_model, trained
from lengthgen.assembly.runs import new_run_config
from lengthgen.cli import main
from lengthgen.errors import ResourceError, UserError
from lengthgen.export.export import export_run
from lengthgen.training.trainer import train
from tests.helpers.limited_calls import calls, permission_bits_bind
from tests.helpers.tiny_runs import error_lines

pytestmark = [pytest.mark.slow, pytest.mark.sweep]  # trains a handful of tiny runs and five small grids
SECONDS = 90  # a case past this hangs: every one of them is a tiny model on a few samples


class Hang(Exception):
    pass


def on_alarm(signum, frame):
    raise Hang()


def judge(call, expect: str | None) -> tuple[str, str]:
    """(kind, detail) of one case. A command (`cli`) returns its exit code, its stderr captured: an
    exception escaping it is a traceback. A Python call (the exported model, the harness model) may
    raise: its error is clean when its message is one line holding `expect`. `expect` None: the case
    must run, and a Python call's result must not be False (its check)."""
    err = io.StringIO()
    command = getattr(call, "cli", False)
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(SECONDS)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            result = call()
    except Hang:
        return "hang", f"past {SECONDS} s"
    except Exception as error:  # noqa: BLE001 (that is what a sweep counts)
        text = str(error).strip()
        if command or expect is None or not isinstance(error, (ValueError, UserError, ResourceError, OSError)) \
                and "WordLevel error" not in text:  # (the tokenizers library raises a bare Exception)
            return "traceback", "".join(traceback.format_exception_only(error)).strip()[-300:]
        return ("clean" if "\n" not in text and expect in text else "unclear"), text
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    text = err.getvalue()
    if "Traceback" in text:
        return "traceback", text[-300:]
    if not command:
        return ("ok", "") if expect is None and result is not False else ("silent", f"returned where '{expect}' was due"
                                                                            if expect else "its check failed")
    if expect is None:
        return ("ok", "") if result == 0 else ("unclear", " / ".join(error_lines(text)))
    if result == 0:
        return "silent", f"exit 0 where '{expect}' was due"
    lines = error_lines(text)
    return ("clean" if len(lines) == 1 and expect in lines[0] else "unclear"), " / ".join(lines)


@pytest.fixture(scope="module")
def lab(tmp_path_factory, one_thread):
    """Runs to be hostile to: an evaluated copy run, a looped one, an LSTM, a text run, exports."""
    root = tmp_path_factory.mktemp("hostile")
    for name, extra in (("run", []), ("looped", LOOPED), ("lstm", ["method=lstm", "model.d_model=16"])):
        trained(root, name, *extra)
    for name in ("run", "looped"):
        assert main(["eval", str(root / name), "--no-progress"]) == 0
    export_run(root / "looped", root / "hf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LENGTHGEN_DATA", str(root / "cache"))
        write_documents(root / "docs", count=12, words=60)
        cfg = new_run_config("experiments/lm/cpu/text.toml", lm_overrides(
            root / "docs", "train.steps=4", "train.checkpoint_interval=4", "train.device=cpu", "eval.lengths=16"))
        train(cfg, root / "text", progress=False)
        yield root


def cli(*argv):
    """A command: judged by its exit code and stderr."""
    def run():
        return main([str(a) for a in argv])
    run.cli = True
    return run


def command(function):
    function.cli = True
    return function


def export_cases(r: Path) -> list:
    """(name, call, expected error or None)."""
    def prepared(name: str, extra) -> Path:
        out = r / "x" / f"holding-{name}"
        out.parent.mkdir(exist_ok=True)
        export_run(r / "looped", out)
        extra(out)
        return out

    holding = {"eval.csv": lambda o: (o / "eval.csv").write_text((r / "looped" / "eval.csv").read_text()),
               "notes.txt": lambda o: (o / "notes.txt").write_text("mine"),
               "runs": lambda o: (o / "runs" / "a").mkdir(parents=True)}
    (r / "x").mkdir(exist_ok=True)
    (r / "x" / "file").write_text("x")
    (r / "x" / "link").symlink_to(r / "hf")
    (r / "x" / "dangling").symlink_to(r / "nowhere")
    (r / "x" / "half").mkdir()
    cases = [
        ("missing run", cli("export", r / "nothing", "--out", r / "x" / "a"), "does not exist"),
        ("out exists", cli("export", r / "looped", "--out", r / "hf"), "exists"),
        ("out inside the run", cli("export", r / "looped", "--out", r / "looped" / "hf"), "inside the run folder"),
        ("out holds the run", cli("export", r / "looped", "--out", r, "--force"), "holds the run folder"),
        ("an export exported", cli("export", r / "hf", "--out", r / "x" / "b"), "exported folder already"),
        ("a folder without a checkpoint", cli("export", r / "x" / "half", "--out", r / "x" / "c"), "no checkpoint"),
        ("a recurrent run", cli("export", r / "lstm", "--out", r / "x" / "d"), "not a transformer"),
        ("--force onto a link", cli("export", r / "looped", "--out", r / "x" / "link", "--force"), "symbolic link"),
        ("a dangling link", cli("export", r / "looped", "--out", r / "x" / "dangling"), "does not exist"),
        ("--force onto a dangling link", cli("export", r / "looped", "--out", r / "x" / "dangling", "--force"),
         "does not exist"),
        ("a file as --out", cli("export", r / "looped", "--out", r / "x" / "file", "--force"), "is a file"),
        ("the current folder", cli("export", r / "looped", "--out", ".", "--force"), "current folder"),
        ("an empty --out", cli("export", r / "looped", "--out", ""), "current folder"),
        ("a name past the file system's", cli("export", r / "looped", "--out", r / "x" / ("n" * 300)), "too long"),
        ("--force onto a reproduction", cli("export", r / "looped", "--out", r / "x", "--force"), "not a lengthgen export"),
        ("/proc as --out", cli("export", r / "looped", "--out", "/proc/lengthgen-hf"), "cannot write into /proc"),
        ("an export", cli("export", r / "looped", "--out", r / "x" / "good"), None),
        ("an export replaced", cli("export", r / "looped", "--out", r / "x" / "good", "--force"), None),
        ("a name with spaces and accents", cli("export", r / "looped", "--out", r / "x" / "modèle exporté"), None),
    ]
    for what, extra in holding.items():
        cases.append((f"--force onto an export holding {what}",
                      command(lambda w=what, e=extra: main(["export", str(r / "looped"), "--out", str(prepared(w, e)),
                                                            "--force"])), f"also holds {what}"))
    return cases


def eval_cases(r: Path) -> list:
    def tampered(name: str, change) -> Path:
        out = r / "t" / name
        export_run(r / "looped", out)
        change(out)
        return out

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-2] ^= 1
        path.write_bytes(bytes(data))

    (r / "t").mkdir(exist_ok=True)
    def evaluate(name: str, change):
        return command(lambda: main(["eval", str(tampered(name, change)), "--lengths", "3", "--no-progress"]))

    cases = [
        ("weights changed in an export", evaluate("w", lambda o: flip(o / "model.safetensors")), "sha256"),
        ("config.json changed in an export", evaluate("c", lambda o: flip(o / "config.json")), "sha256"),
        ("an export's mark not JSON", evaluate("m", lambda o: (o / "lengthgen_export.json").write_text("{")),
         "not the mark"),
        ("an export's mark removed", evaluate("n", lambda o: (o / "lengthgen_export.json").unlink()), "no checkpoint"),
    ]
    for stop, says in (("fixed:12000000", "needs at most"), ("confidence:+99999999", "99,999,999 iterations"),
                       ("confidence-per-sample:8:999999", "needs at most"), ("fixed:0", "positive integers"),
                       ("fixed:-1", "positive integers"), ("confidence:1e9", "positive integers")):
        cases.append((f"--stop {stop}", cli("eval", r / "looped", "--stop", stop, "--lengths", "1:2", "--samples", "4",
                                           "--no-progress"), says))
        cases.append((f"--stop {stop} on an export", cli("eval", r / "hf", "--stop", stop, "--lengths", "1:2",
                                                         "--samples", "4", "--no-progress"), says))
    for flag, value, says in (("--batch-size", "0", ">= 1"), ("--batch-size", "-3", ">= 1"),
                              ("--samples", "0", ">= 1"), ("--samples", "-5", ">= 1")):
        cases.append((f"eval {flag} {value}", cli("eval", r / "hf", flag, value, "--no-progress"), says))
    cases.append(("eval of an export", cli("eval", r / "hf", "--lengths", "2:5", "--stop", "oracle,confidence:+8",
                                           "--no-progress", "--out", r / "t" / "again"), None))
    return cases


def model_cases(r: Path) -> list:
    from transformers import AutoTokenizer

    model, tok = hf_model(r / "hf"), AutoTokenizer.from_pretrained(str(r / "hf"), trust_remote_code=True)
    ids, question = torch.tensor([[3, 4, 4, 3, 5, 2, 2, 2]]), torch.tensor([[3, 4, 4, 3, 5]])
    cases = []
    for kwargs, says in (({"num_steps": 1_000_000}, "past this model's bound"), ({"num_steps": -1}, "positive"),
                         ({"num_steps": 0}, "positive"), ({"num_steps": 2.5}, "positive"), ({"num_steps": True}, "positive"),
                         ({"num_steps": "3"}, "positive"), ({}, "needs num_steps or stop"),
                         ({"num_steps": 3, "stop": "confidence"}, "needs num_steps or stop"),
                         ({"stop": "confidence:100000000"}, "past this model's bound"), ({"stop": "confidence:0"}, "positive"),
                         ({"stop": "oracle"}, "T(n)"), ({"stop": "halt"}, "halting head"), ({"stop": "bogus"}, "is not one of"),
                         ({"stop": "fixed"}, "is not one of"), ({"stop": "fixed:abc"}, "is not one of"),
                         ({"stop": "first-confident:+5"}, "is not one of")):
        cases.append((f"model({kwargs})", lambda k=kwargs: model(ids, **k), says))
    for tokens, says in ((0, "positive"), (-1, "positive"), (100_000, "past this model's bound"), (2.5, "positive")):
        cases.append((f"generate(max_new_tokens={tokens})",
                      lambda t=tokens: model.generate(question, max_new_tokens=t, num_steps=3), says))
    for text in ("01x1=", "0 1=", "é="):
        cases.append((f"tokenizer({text!r})", lambda t=text: tok(t), "Missing [UNK]"))
    cases += [("model(num_steps=3)", lambda: model(ids, num_steps=3).steps.tolist() == [3], None),
              ("model(stop='confidence')", lambda: model(ids, stop="confidence").logits.shape == (1, 8, model.config.vocab_size), None),
              ("generate(max_new_tokens=2)", lambda: model.generate(question, max_new_tokens=2, num_steps=3).shape == (1, 7), None),
              ("tokenizer('0110=')", lambda: tok("0110=").input_ids == [3, 4, 4, 3, 5], None)]
    return cases


def harness_cases(r: Path) -> list:
    lm_eval = pytest.importorskip("lm_eval", reason="the harness extra")  # noqa: F841
    from lengthgen.export.harness import LengthgenLM

    text = str(r / "text")
    lm = lambda **k: LengthgenLM(**{"run": text, "device": "cpu", **k})  # noqa: E731
    cases = [(f"model_args {k}={v!r}", lambda k=k, v=v: lm(**{k: v}), says) for k, v, says in (
        ("window", -5, "positive"), ("window", float("nan"), "positive"), ("window", "abc", "positive"),
        ("window", 0, "positive"), ("window", 100_000_000, "past what this run could need"), ("window", 2.5, "positive"),
        ("window", True, "positive"), ("batch_size", 0, "positive"), ("batch_size", -1, "positive"),
        ("batch_size", "abc", "positive"), ("batch_size", 10 ** 15, "free memory"), ("max_gen_toks", 0, "positive"),
        ("max_gen_toks", 10 ** 9, "past what this run could need"), ("windw", 16, "no key 'windw'"),
        ("device", "gpu", "not a device"), ("run", str(r / "nothing"), "does not exist"),
        ("run", str(r / "run"), "text runs only"), ("run", "", "needs run=RUN"), ("run", 123, "does not exist"))]
    if not torch.cuda.is_available():
        cases += [("--device cuda without CUDA", lambda: lm(device="cuda"), "CUDA is not available"),
                  ("--device cuda:7 without CUDA", lambda: lm(device="cuda:7"), "CUDA is not available")]
    cases += [("model_args window=64", lambda: lm(window=64).scorer.window == 64, None),
              ("batch_size auto", lambda: lm(batch_size="auto:4").scorer.batch_size == 8, None)]
    return cases


def report_cases(r: Path) -> list:
    def edited(name: str, column: str, value: str) -> Path:
        folder = r / "rep" / name
        folder.mkdir(parents=True)
        (folder / "config.toml").write_text((r / "run" / "config.toml").read_text())
        lines = (r / "run" / "eval.csv").read_text().splitlines()
        header = lines[0].split(",")
        cells = lines[1].split(",")
        cells[header.index(column)] = value
        (folder / "eval.csv").write_text("\n".join([lines[0], ",".join(cells), *lines[2:]]) + "\n")
        return folder

    (r / "rep" / "empty").mkdir(parents=True)
    (r / "rep" / "file").write_text("x")
    (r / "rep" / "theirs").mkdir()
    (r / "rep" / "theirs" / "report.md").write_text("my own notes")
    report = lambda *a: cli("report", *a)  # noqa: E731
    return [
        ("report of a missing folder", report(r / "nothing"), "does not exist"),
        ("report of an empty folder", report(r / "rep" / "empty"), "no eval.csv"),
        ("report --out a file", report(r / "run", "--out", r / "rep" / "file"), "is a file"),
        ("report over a report.md of the user's", report(r / "run", "--out", r / "rep" / "theirs"), "not one lengthgen wrote"),
        ("seed -1 in eval.csv", report(edited("seed", "seed", "-1")), "seed is '-1', negative"),
        ("length 0 in eval.csv", report(edited("length", "length", "0")), "length is '0', not positive"),
        ("train_max -4 in eval.csv", report(edited("train_max", "train_max", "-4")), "not positive"),
        ("--compare an arm with itself", report(r / "run", "--out", r / "rep" / "c1", "--compare", "ntp,ntp"), "two different"),
        ("--compare arms not run", report(r / "run", "--out", r / "rep" / "c2", "--compare", "a,b"), "--compare"),
        ("--threshold 2", report(r / "run", "--out", r / "rep" / "c3", "--threshold", "2"), "between 0 and 1"),
        ("--threshold nan", report(r / "run", "--out", r / "rep" / "c4", "--threshold", "nan"), "between 0 and 1"),
        ("a report", report(r / "run", r / "looped", "--out", r / "rep" / "ok"), None),
    ]


def grid_cases(r: Path) -> list:
    """Issue 1: the Chomsky grid's report crashed on a series whose mean is 0, however it was cut down."""
    def grid(name: str, *flags: str):
        out = r / "grids" / name

        @command
        def run() -> int:
            code = main(["reproduce", "chomsky", "--seeds", "1", "--set", "train.steps=5", "--samples", "4",
                         "--out", str(out), "--no-progress", "--workers", "1", *flags])
            return code if code or "## Main table" in (out / "report.md").read_text() else 99  # 99: no main table
        return run

    cpu = ("--scale", "cpu", "--arms", "lstm")
    return [
        ("the issue's grid", grid("plain", *cpu, "--tasks", "parity_check"), None),
        ("a task given twice", grid("twice", *cpu, "--tasks", "parity_check,parity_check"), None),
        ("padded names", grid("padded", "--scale", "cpu", "--tasks", " parity_check ", "--arms", " lstm , lstm"), None),
        ("--stack-seeds", grid("stacked", *cpu, "--tasks", "parity_check", "--stack-seeds"), None),
        ("--scale paper cut down", grid("paper", "--scale", "paper", "--arms", "lstm", "--tasks", "even_pairs",
                                        "--set", "eval.lengths=41,45"), None),
        ("--out a run folder", cli("reproduce", "chomsky", "--tasks", "parity_check", "--arms", "lstm", "--out", r / "run",
                                   "--no-progress"), "is a run folder"),
        ("--out an export", cli("reproduce", "chomsky", "--tasks", "parity_check", "--arms", "lstm", "--out", r / "hf",
                                "--no-progress"), "lengthgen export"),
    ]


def machine_cases(r: Path) -> list:
    """A full disk (a file-size limit) and an unwritable folder, in a subprocess each."""
    def limited(argv, **limits):
        @command
        def run():
            [(code, err)] = calls([argv], r, **limits)
            if code == "traceback":
                raise RuntimeError(err[-300:])
            print(err, end="", file=__import__("sys").stderr)
            return code
        return run

    locked = r / "locked"
    locked.mkdir(mode=0o555, exist_ok=True)
    cases = [("export on a full disk", limited(["export", str(r / "looped"), "--out", "full"], file_size=8192), "no space"),
             ("report on a full disk", limited(["report", str(r / "looped"), "--out", "full-report"], file_size=2048),
              "no space")]
    if permission_bits_bind(r):
        cases += [("export into an unwritable folder", limited(["export", str(r / "looped"), "--out",
                                                                str(locked / "hf")], unprivileged=True), "Permission denied"),
                  ("report into an unwritable folder", limited(["report", str(r / "looped"), "--out",
                                                                str(locked / "rep")], unprivileged=True), "Permission denied")]
    return cases


def test_the_sweep_finds_no_traceback_hang_or_silent_case(lab, capsys):
    cases = (export_cases(lab) + eval_cases(lab) + model_cases(lab) + harness_cases(lab) + report_cases(lab)
             + grid_cases(lab) + machine_cases(lab))
    results = [(name, *judge(call, expect)) for name, call, expect in cases]
    counts = Counter(kind for _, kind, _ in results)
    with capsys.disabled():
        print(f"\nhostile sweep: {len(results)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for name, kind, detail in results:
            print(f"  {kind:<9} {name}: {detail[:160]}")
    bad = [(name, kind, detail) for name, kind, detail in results if kind not in ("clean", "ok")]
    assert not bad, json.dumps(bad, indent=1)
    assert not list(lab.glob(".*.tmp")) and not list((lab / "x").glob(".*.tmp"))  # no temporary folder left
