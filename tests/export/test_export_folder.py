"""The export folder as a user meets it: what it holds, the model card, the tokenizer, loading with
no lengthgen installed, `lengthgen eval` and `lengthgen report` on it, and bad input as one line."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from exports import LOOPED, exported, trained
from lengthgen.cli import main
from lengthgen.results.rows import read_rows
from lengthgen.runtime import checkpoint
from tests.helpers.tiny_runs import one_line_error


@pytest.fixture(scope="module")
def looped(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("export-folder")
    run = trained(root, "run", *LOOPED)
    assert main(["eval", str(run), "--no-progress"]) == 0
    assert main(["export", str(run), "--out", str(root / "hf")]) == 0
    return run, root / "hf"


def test_the_folder_and_its_model_card(looped):
    run, out = looped
    for name in ("config.json", "model.safetensors", "modeling_lengthgen.py", "looped_block.py", "tokenizer.json",
                 "tokenizer_config.json", "generation_config.json", "README.md", "config.toml"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())
    assert config["family"] == "looped" and config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_lengthgen")
    card = (out / "README.md").read_text()
    rows = read_rows(run / "eval.csv")
    assert "trained on lengths 1 to 4" in card and "lengthgen train config.toml" in card and "MIT licence" in card
    assert "| 4 (beyond training)" not in card and "random baseline" in card and 'method = "looped"' in card
    assert f"{rows[-1]['accuracy']:.4f}" in card and f"{rows[-1]['baseline']:.3g}" in card


def test_it_loads_without_lengthgen_and_tokenizes_the_task(looped, tmp_path):
    """In a fresh process where importing lengthgen fails: the bundled code is all it needs."""
    _, out = looped
    code = ("import sys; sys.modules['lengthgen'] = None\n"
            "import torch\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
            f"t = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
            "ids = t('0110=', return_tensors='pt')['input_ids']\n"
            "print(ids.tolist(), t.decode([3, 4, 5]), m.generate(ids, max_new_tokens=4, num_steps=3).shape)")
    env = {"HF_MODULES_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[[3, 4, 4, 3, 5]] 01= torch.Size([1, 9])"


def test_eval_and_report_take_an_export(looped, tmp_path, capsys):
    """A downloaded export evaluated again without its run folder: the same rows as the run's."""
    run, out = looped
    assert main(["eval", str(out), "--no-progress", "--out", str(tmp_path / "again")]) == 0
    mine, theirs = read_rows(run / "eval.csv"), read_rows(tmp_path / "again" / "eval.csv")
    assert [(r["length"], r["accuracy"], r["token_accuracy"]) for r in theirs] == \
        [(r["length"], r["accuracy"], r["token_accuracy"]) for r in mine]
    assert main(["eval", str(out), "--no-progress", "--lengths", "3"]) == 0  # into the export folder itself
    assert [r["length"] for r in read_rows(out / "eval.csv")] == [3]
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    assert "copy" in (tmp_path / "report" / "report.md").read_text()


def test_bad_input_is_one_line(looped, tmp_path, capsys):
    run, out = looped
    cases = [
        (["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")], "nothing"),
        (["export", str(run), "--out", str(out)], "exists"),
        (["export", str(run), "--out", str(run.parent), "--force"], "holds the run folder"),
        (["export", str(run), "--out", str(run.parent.parent), "--force"], "holds the run folder"),
        (["export", str(run), "--out", str(run / "inside")], "inside the run folder"),
        (["export", str(out), "--out", str(tmp_path / "y")], "exported folder already"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        assert message in one_line_error(capsys)
    (tmp_path / "half").mkdir()
    assert main(["export", str(tmp_path / "half"), "--out", str(tmp_path / "z")]) == 2
    assert "no checkpoint" in one_line_error(capsys)
    fresh = tmp_path / "fresh"
    assert main(["export", str(run), "--out", str(fresh)]) == 0
    assert main(["export", str(run), "--out", str(fresh), "--force"]) == 0  # an earlier export is replaced


def test_an_unfinished_run_is_refused(tmp_path, capsys):
    run = trained(tmp_path, "run", "train.steps=2")
    state = next((run / "checkpoints").glob("step_*")) / "state.json"
    data = json.loads(state.read_text())
    data["finished"] = False  # as a run stopped early leaves it (signed again, as lengthgen signs it)
    data[checkpoint.SELF_DIGEST] = checkpoint.state_digest(data)
    state.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    line = one_line_error(capsys)
    assert "not a finished run" in line


def test_a_halting_head_is_named_in_one_line(tmp_path, capsys):
    run, out = exported(tmp_path, "halt", *LOOPED, "method=looped-halt")
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out), "--force"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "halting head" in notes[0]
    assert main(["eval", str(out), "--no-progress", "--stop", "halt"]) == 0  # kept for lengthgen


def test_the_card_names_the_reproduction_and_arm(looped, tmp_path):
    """A run inside a reproduction (OUT/runs/RUN, OUT/report.md, RUN/series.json): its title,
    arm and command are on the card."""
    run, _ = looped
    inside = tmp_path / "repro" / "runs" / "copy-looped-s0"
    shutil.copytree(run, inside)
    (inside / "series.json").write_text(json.dumps({"arm": "looped"}))
    (tmp_path / "repro" / "report.md").write_text("# Looped Transformers (Fan et al., ICLR 2025): cpu scale\n\n"
                                                  "Regenerate with:\n\n    lengthgen reproduce looped --tasks copy\n")
    assert main(["export", str(inside), "--out", str(tmp_path / "hf")]) == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "reproduction **Looped Transformers (Fan et al., ICLR 2025): cpu scale**, arm **looped**" in card
    assert "lengthgen reproduce looped --tasks copy" in card
