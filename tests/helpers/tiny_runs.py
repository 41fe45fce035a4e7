"""The toy run the safety and fault tests share: a copy task small enough to train in a second;
the checks of a one-line error on stderr, and `tree`, to check that a refused command changed nothing."""
from __future__ import annotations

from lengthgen.cli import main
from lengthgen.assembly.runs import new_run_config

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.name=copy", "task.train_max=4",
        "train.batch_size=8", "train.log_interval=5", "train.device=cpu", "train.steps=6",
        "train.checkpoint_interval=100", "eval.lengths=2,4", "eval.samples=16"]


def tiny(*extra: str):
    return new_run_config(None, TINY + list(extra))


def train_cli(out, *extra: str) -> int:
    return main(["train", "--defaults", *[f"--set={s}" for s in TINY], "--out", str(out), "--no-progress", *extra])


def error_lines(err: str) -> list[str]:
    """What stderr says beyond notes and progress bars."""
    return [line for line in err.strip().splitlines()
            if line.strip() and not line.startswith(("note:", "lengthgen: note:")) and "it/s]" not in line]


def one_line_error(capsys) -> str:
    """The one line of stderr that a refused command printed (no traceback)."""
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def tree(folder) -> dict:
    """{path under `folder`: its bytes (None for a folder)}: equal before and after a command that changed nothing."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


def killed_after(command: list[str], folder, step: int = 50, timeout: float = 120) -> int:
    """Start a `train` command, kill it (SIGKILL, as a crash) once its checkpoint of `step` or later
    is written; returns the step of its latest checkpoint then."""
    import os
    import signal
    import subprocess
    import time
    from pathlib import Path

    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    pointer = Path(folder) / "checkpoints" / "latest"
    deadline = time.time() + timeout
    while time.time() < deadline and not (pointer.exists() and pointer.read_text() >= f"step_{step:08d}"):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return int(pointer.read_text().split("_")[1])
