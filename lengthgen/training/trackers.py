"""Experiment trackers: the training metrics in TensorBoard and Weights & Biases, beside metrics.jsonl.

`train.log_to` names the sinks. metrics.jsonl is always written (resume and reports read
it), whether or not "jsonl" is listed; the others are optional extras, imported only when
a run asks for them, so a machine without them trains exactly as before:

    pip install 'lengthgen[tensorboard]'     # RUN/tensorboard/: event files, `tensorboard --logdir RUN`
    pip install 'lengthgen[wandb]'           # RUN/wandb/: a W&B run, offline unless WANDB_MODE says otherwise

Every metrics line (step, loss, lr, max_length, samples_per_s, time) goes to every sink,
each number under `train/<name>` at its step. A resumed run continues the same TensorBoard
log (events after the checkpoint are purged) and the same W&B run (its id is kept in
RUN/wandb/run_id). W&B runs offline by default, with no account and no network: upload
later with `wandb sync RUN/wandb/offline-run-*`, or set WANDB_MODE=online to stream.
"""
from __future__ import annotations

import importlib
import os
import secrets
from pathlib import Path

from lengthgen.errors import UserError

# sink -> (module it needs, pip extra); "jsonl" needs nothing and is written by the trainer itself
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
FOLDERS = ("tensorboard", "wandb")  # what the sinks write inside a run folder


def optional_sinks(names: list[str]) -> list[str]:
    """The sinks of `names` beyond metrics.jsonl, each once, in the order given."""
    return [name for name in dict.fromkeys(names) if name in EXTRAS]


def check_installed(names: list[str]) -> None:
    """A one-line UserError naming the pip extra of the first sink that is not installed;
    called before a run folder is made, so a missing package writes nothing."""
    for name in optional_sinks(names):
        module, extra = EXTRAS[name]
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserError(f"train.log_to {name!r} needs the {module} package: "
                            f"pip install 'lengthgen[{extra}]'") from None


class TensorBoard:
    """Event files in RUN/tensorboard. Resumed from the checkpoint of `step`, the events of later
    steps (logged before the run stopped, and logged again now) are purged, as in metrics.jsonl."""

    def __init__(self, folder: Path, step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / "tensorboard"), purge_step=step + 1 if step else None)

    def log(self, row: dict) -> None:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(f"train/{key}", value, row["step"])
        self.writer.flush()  # a killed run keeps what it logged (lines come every log_interval steps)

    def close(self) -> None:
        self.writer.close()


class WandB:
    """A W&B run in RUN/wandb, named after the run folder, with the resolved config. Offline
    unless WANDB_MODE is set; no console capture or system metrics (they would slow short runs).
    Steps are logged as the metric `train/step`, so a resumed run that logs a step again adds
    a point rather than being refused for going back in W&B's own step counter."""

    def __init__(self, folder: Path, config: dict):
        import wandb

        root = folder / "wandb"
        root.mkdir(exist_ok=True)
        id_file = root / "run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
        id_file.write_text(run_id + "\n")
        settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_meta=True, save_code=False,
                                  disable_git=True, silent=True, x_save_requirements=False)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "lengthgen"), name=folder.name, id=run_id,
                                  resume="allow", dir=str(folder), config=config, settings=settings,
                                  mode=os.environ.get("WANDB_MODE") or "offline")
        except Exception as err:  # e.g. WANDB_MODE=online without an account or network
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(f"W&B could not start a run ({first}); unset WANDB_MODE to log offline") from None
        self.run.define_metric("train/step")
        self.run.define_metric("train/*", step_metric="train/step")

    def log(self, row: dict) -> None:
        self.run.log({f"train/{k}": v for k, v in row.items() if isinstance(v, (int, float))})

    def close(self) -> None:
        self.run.finish()


class Sinks:
    """The optional sinks of one run; `log` sends a metrics line to each, `close` ends them."""

    def __init__(self, names: list[str], folder: Path, config: dict, step: int):
        self.sinks = []
        try:
            for name in optional_sinks(names):
                self.sinks.append(TensorBoard(folder, step) if name == "tensorboard" else WandB(folder, config))
        except BaseException:
            self.close()
            raise

    def log(self, row: dict) -> None:
        for sink in self.sinks:
            sink.log(row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []
