"""The toy run the safety and fault tests share: a copy task small enough to train in a second."""
from __future__ import annotations

from lengthgen.cli import main
from lengthgen import assembly

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.name=copy", "task.train_max=4",
        "train.batch_size=8", "train.log_interval=5", "train.device=cpu", "train.steps=6",
        "train.checkpoint_interval=100", "eval.lengths=2,4", "eval.samples=16"]


def tiny(*extra: str):
    return assembly.load(None, TINY + list(extra))


def train_cli(out, *extra: str) -> int:
    return main(["train", *[f"--set={s}" for s in TINY], "--out", str(out), "--no-progress", *extra])


def error_lines(err: str) -> list[str]:
    """What stderr says beyond notes and progress bars."""
    return [line for line in err.strip().splitlines()
            if line.strip() and not line.startswith(("note:", "lengthgen: note:")) and "it/s]" not in line]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]
