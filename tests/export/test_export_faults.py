"""`lengthgen export` under bad input and a failing machine: --force deletes only what an export
wrote, links and files as --out, a full disk, an unwritable folder and a missing `tokenizers`,
each one line with nothing left behind; the files' modes and the checksum `eval` verifies; the
notes on what an export cannot express; a reproduction never written into a run or an export."""
from __future__ import annotations

import json
import os
import sys

import pytest

from exports import LOOPED, trained
from lengthgen.cli import main
from lengthgen.export import export
from tests.helpers.limited_calls import calls, permission_bits_bind
from tests.helpers.tiny_runs import error_lines, one_line_error, tree
from tests.helpers.toy_papers import positions_grid, toy_paper, toy_preset


@pytest.fixture(scope="module")
def run(tmp_path_factory, one_thread):
    """A finished, evaluated tiny looped run."""
    root = tmp_path_factory.mktemp("export-faults")
    folder = trained(root, "run", *LOOPED)
    assert main(["eval", str(folder), "--no-progress"]) == 0
    return folder


def hidden(folder):
    """What a failed export could leave beside --out: temporary folders and lock files."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def exported_into(run, out):
    assert main(["export", str(run), "--out", str(out)]) == 0
    return tree(out)


@pytest.mark.parametrize("extra", ["eval.csv", "notes.txt", "runs"])
def test_force_replaces_only_the_files_an_export_wrote(run, tmp_path, capsys, extra):
    """Issue 3: an evaluation's eval.csv, a user's file and a reproduction's runs/ in an export
    folder are never deleted by --force; the refusal names what is there."""
    out = tmp_path / "hf"
    exported_into(run, out)
    if extra == "eval.csv":
        assert main(["eval", str(out), "--lengths", "3", "--no-progress"]) == 0
    elif extra == "notes.txt":
        (out / "notes.txt").write_text("mine")
    else:
        (out / "runs" / "copy-s0" / "checkpoints").mkdir(parents=True)
        (out / "runs" / "copy-s0" / "config.toml").write_text("[task]\n")
    before = tree(out)
    capsys.readouterr()
    assert main(["export", str(run), "--out", str(out), "--force"]) == 2
    line = one_line_error(capsys)
    assert f"also holds {extra}" in line and "move it away" in line
    assert tree(out) == before and hidden(tmp_path) == []


def test_force_replaces_an_export_whole_and_keeps_no_file_of_the_old_one(run, tmp_path):
    out = tmp_path / "hf"
    exported_into(run, out)
    (out / ".config.json.tmp").write_text("a leftover of an atomic write")
    assert main(["export", str(run), "--out", str(out), "--force"]) == 0
    assert not (out / ".config.json.tmp").exists() and hidden(tmp_path) == []
    mark = json.loads((out / "lengthgen_export.json").read_text())
    assert set(mark["sha256"]) == {p.name for p in out.iterdir()} - {"lengthgen_export.json"}


def test_links_and_files_as_out_are_one_line_and_leave_nothing(run, tmp_path, capsys):
    """Issue 6: --force onto a link to an export, a dangling link, a file: refused before any write."""
    target = tmp_path / "hf"
    exported = exported_into(run, target)
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    for out, flags, says in [("link", ["--force"], "symbolic link to"), ("dangling", [], "which does not exist"),
                             ("dangling", ["--force"], "which does not exist"), ("file", ["--force"], "is a file")]:
        capsys.readouterr()
        assert main(["export", str(run), "--out", str(tmp_path / out), *flags]) == 2
        assert says in one_line_error(capsys)
    assert tree(target) == exported and hidden(tmp_path) == [] and not (tmp_path / "nowhere").exists()


def test_a_full_disk_is_one_line_and_an_earlier_export_stays(run, tmp_path):
    """Issue 6: the weights fail to write (a file-size limit: EFBIG, as a full disk's ENOSPC)."""
    earlier = exported_into(run, tmp_path / "kept")
    new, forced = calls([["export", str(run), "--out", "new"], ["export", str(run), "--out", "kept", "--force"]],
                        tmp_path, file_size=8 * 1024)
    for code, err in (new, forced):
        lines = error_lines(err)
        assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
        assert "no space left to write" in lines[0] and "nothing written" in lines[0]
    assert not (tmp_path / "new").exists() and tree(tmp_path / "kept") == earlier and hidden(tmp_path) == []


@pytest.mark.slow
def test_an_unwritable_folder_is_one_line(run, tmp_path):
    if not permission_bits_bind(tmp_path):
        pytest.skip("permission bits do not stop this user's writes")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        [(code, err)] = calls([["export", str(run), "--out", str(locked / "hf")]], tmp_path, unprivileged=True)
    finally:
        locked.chmod(0o755)
    lines = error_lines(err)
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "Permission denied" in lines[0] and str(locked) in lines[0]
    assert list(locked.iterdir()) == []


def test_a_missing_tokenizers_names_the_extra(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as where the hf extra is not installed
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    assert "pip install 'lengthgen[hf]'" in one_line_error(capsys)
    assert not (tmp_path / "hf").exists() and hidden(tmp_path) == []


def test_files_have_the_mode_of_a_checkpoint(run, tmp_path):
    """Issue 9: safetensors writes 0600; an export's files are as readable as a checkpoint's."""
    out = tmp_path / "hf"
    exported_into(run, out)
    state = next((run / "checkpoints").glob("step_*")) / "state.json"
    want = state.stat().st_mode & 0o777
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {p.name: want for p in out.iterdir()}
    assert out.stat().st_mode & 0o777 == (run.stat().st_mode & 0o777)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_eval_refuses_an_export_whose_files_changed(run, tmp_path, capsys, name):
    """Issue 9: weights overwritten in an export folder are not evaluated silently (accuracy 0, exit 0)."""
    out = tmp_path / "hf"
    exported_into(run, out)
    data = bytearray((out / name).read_bytes())
    data[-2] ^= 1  # still valid safetensors or JSON (the last byte of the JSON is its newline)
    (out / name).write_bytes(bytes(data))
    assert main(["eval", str(out), "--lengths", "3", "--no-progress"]) == 2
    line = one_line_error(capsys)
    assert name in line and "sha256" in line and not (out / "eval.csv").exists()


def test_an_export_from_before_digests_is_evaluated(run, tmp_path):
    out = tmp_path / "hf"
    exported_into(run, out)
    (out / "lengthgen_export.json").write_text(json.dumps({"run": "run", "step": 3}))
    assert main(["eval", str(out), "--lengths", "3", "--no-progress"]) == 0


def test_the_scratch_folder_is_this_process_own_and_a_killed_ones_goes(tmp_path):
    out = tmp_path / "hf"
    stale = tmp_path / ".hf.abcd1234.export.tmp"  # an export killed before it could remove its own
    another = tmp_path / ".hf.x.abcd1234.export.tmp"  # the scratch of `--out hf.x`, running meanwhile
    stale.mkdir()
    another.mkdir()
    first = export.new_scratch(out)
    assert first.parent == tmp_path and first.name.startswith(".hf.") and first.name.endswith(".export.tmp")
    assert first.stat().st_mode & 0o777 == 0o777 & ~export.current_umask()  # not mkdtemp's 0700
    assert not stale.exists() and another.is_dir()
    second = export.new_scratch(out)  # (only under --out's lock: any other scratch of hf is a killed export's)
    assert second != first and not first.exists() and another.is_dir()


def test_the_encoder_note_names_its_layout_not_pause_tokens(tmp_path, capsys):
    """Issue 9: the encoder's note spoke of pause tokens; it names the function that lays batches out."""
    run = trained(tmp_path, "enc", "method=encoder", "task.name=reverse_string", "model.causal=false")
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "lengthgen.methods.encoder.Encoder.model_batch" in notes[0] and "pause" not in notes[0]
    pause = trained(tmp_path, "pause", "method=ntp-pause")
    assert main(["export", str(pause), "--out", str(tmp_path / "pause-hf")]) == 0
    assert "model_batch" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["run", "export"])
def test_a_reproduction_is_never_written_into_a_run_or_an_export(run, tmp_path, capsys, kind):
    """Issue 9: `reproduce --out RUN` then `report RUN` mixed the run's rows with the grid's."""
    toy_paper(tmp_path / "paper", positions_grid("Into"), {"parity": toy_preset(steps=10, samples=8)})
    out = run if kind == "run" else tmp_path / "hf"
    if kind == "export":
        exported_into(run, out)
    before = tree(out)
    assert main(["reproduce", str(tmp_path / "paper"), "--out", str(out), "--no-progress"]) == 2
    assert ("is a run folder" if kind == "run" else "is a folder of `lengthgen export`") in one_line_error(capsys)
    assert tree(out) == before
    assert not os.path.exists(out.parent / f".{out.name}.lock")
