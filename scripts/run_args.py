"""What the analysis scripts here share: `SCRIPT RUN_DIR [LENGTH ...]` read into a loaded run."""
import copy
import sys
from dataclasses import replace

import torch

from lengthgen.assembly.runs import training_positions
from lengthgen.config.schema import MAX_LENGTH
from lengthgen.errors import UserError
from lengthgen.evaluation.evaluate import load_assembled
from lengthgen.tasks import score


def open_run(script: str, default_lengths: list[int], task: str | None = None, looped: bool = False):
    """(folder, lengths, cfg, task, method, model), the model on the CPU (lengths: those given, else
    `default_lengths`, which may be empty for a script to choose from the run); a one-line error and a
    non-zero exit on bad arguments, a missing or corrupt run, or a run of the wrong task or method."""
    try:
        args = sys.argv[1:]
        if not args or not all(a.isascii() and a.isdigit() and 0 < int(a) <= MAX_LENGTH for a in args[1:]):
            raise UserError(f"usage: {script}.py RUN_DIR [LENGTH ...] (lengths: integers 1..{MAX_LENGTH})")
        folder, lengths = args[0], [int(n) for n in args[1:]] or default_lengths
        run, model, _ = load_assembled(folder, torch.device("cpu"))
        cfg, run_task, method = run.cfg, run.task, run.method
        check_fits(run, max(lengths, default=1))
        if task and run_task.name != task:
            raise UserError(f"{folder} is a {run_task.name!r} run; {script} needs a {task} one")
        if looped and not method.has_stop_rules:
            raise UserError(f"{folder} is a {cfg.method!r} run; {script} needs a looped one")
    except UserError as err:
        sys.exit(f"{script}: {err}")
    return folder, lengths, cfg, run_task, method, model


def check_fits(run, length: int) -> None:
    """A test length whose sequences outrun a learned or sinusoidal position table is
    refused here, in one line, instead of failing inside the model."""
    cfg = run.cfg
    if run.scheme.has_table:
        at = copy.deepcopy(cfg)
        at.task.train_max = length
        need = training_positions(replace(run, cfg=at))[1] + 1  # rows the IDs read: 0..L-1, or the task's own
        if need > cfg.model.max_positions:
            raise UserError(f"length {length} needs {need} positions; the run's table has "
                            f"model.max_positions = {cfg.model.max_positions}")


@torch.no_grad()
def predictions(method, model, batch) -> torch.Tensor:
    """(B, L) predicted tokens aligned with batch.targets: oracle stop for looped methods,
    greedy decoding otherwise."""
    return method.predict_stop(model, batch, "oracle")[0] if method.has_stop_rules \
        else method.predict(model, batch)


def right_answers(method, model, batch, pred: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) bool: whole-answer exact match of `pred` (default: `predictions`)."""
    return score(predictions(method, model, batch) if pred is None else pred, batch)[0]
