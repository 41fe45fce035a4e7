"""Nothing left behind: a write that fails leaves no partial file, so a retry works, and caches go
where docs/faults.md says ("What is left on disk")."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.runtime import checkpoint
from tests.helpers.tiny_runs import one_line_error


def disk_full_once(monkeypatch):
    """The next write_text fails as a full disk does, after writing nothing."""
    real = Path.write_text

    def full(self, *args, **kwargs):
        monkeypatch.setattr(Path, "write_text", real)
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", full)


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "latest"
    path.write_text("step_00000010")
    disk_full_once(monkeypatch)
    try:
        checkpoint.write_atomic(path, "step_00000020")
    except OSError as err:
        assert err.errno == errno.ENOSPC
    assert path.read_text() == "step_00000010" and sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


def test_eval_out_on_a_full_disk_leaves_no_config_and_the_retry_works(copy, tmp_path, monkeypatch, capsys):
    out = tmp_path / "elsewhere"
    disk_full_once(monkeypatch)  # the first write of the evaluation: the copy of the run's config.toml
    assert main(["eval", str(copy), "--out", str(out), "--lengths", "2", "--no-progress"]) == 1
    assert "No space left" in one_line_error(capsys)
    assert not (out / "config.toml").exists() and not list(out.glob(".*.tmp"))
    assert main(["eval", str(copy), "--out", str(out), "--lengths", "2", "--no-progress"]) == 0
    assert (out / "config.toml").read_bytes() == (copy / "config.toml").read_bytes()


def test_a_corpus_build_on_a_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    """`lengthgen corpus` stopped by a full disk mid-split: no .train.bin.tmp is left to fill the
    disk again, and the retry builds the corpus whole."""
    from lengthgen.tasks import corpus as corpora
    from lengthgen.tasks.corpus import Corpus

    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path / "cache"))
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(40):
        (docs / f"doc{i:02d}.txt").write_text(f"document {i} " * 50 + "\n")

    def disk_full(*args, **kwargs):  # the split's temporary file is open when its tokens are written
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(Corpus, "encode_many", disk_full)
        with pytest.raises(OSError, match="No space left"):
            Corpus("files", str(docs)).tokens("train")
    folder = Corpus("files", str(docs)).tokens_folder()
    assert folder.is_dir() and not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    corpora.CHECKED.clear()
    assert len(Corpus("files", str(docs)).tokens("train")) > 0


@pytest.mark.slow
def test_a_local_ray_instance_leaves_no_session_folder(tmp_path, monkeypatch):
    """Ray keeps a session folder per instance in its temp folder, and nothing clears them: the one
    reproduce starts for itself is removed when it shuts down."""
    ray = pytest.importorskip("ray")
    from lengthgen.reproduction import ray_runner

    if ray.is_initialized():
        pytest.skip("this process already holds a Ray instance")
    seen = []
    real = ray_runner.session_folder
    monkeypatch.setattr(ray_runner, "session_folder", lambda r: seen.append(real(r)) or seen[-1])
    assert ray_runner.run_on_ray(lambda job: job, [], tmp_path, None, progress=False, gpus_per_job=None) == []
    assert seen and seen[0] is not None and seen[0].name.startswith("session_") and not seen[0].exists()
