"""Evaluator: accuracy at every requested length on a fixed evaluation seed.

Each length draws its samples from its own generator seeded by (eval seed,
length), so a length's test set is the same whichever other lengths are
requested and in whatever order. Results are rows keyed by values
(run, task, method, seed, length, ...), written to RUN/eval.csv; rows of a
previous evaluation at other lengths are kept.
"""
from __future__ import annotations

import csv
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import checkpoint
from .config import Config, from_dict
from .errors import UserError
from .methods import Method, get_method, score
from .tasks import Task, get_task
from .train import pick_device

COLUMNS = ["run", "task", "method", "position", "seed", "length", "n", "accuracy", "token_accuracy",
           "train_max", "baseline", "step"]
# n: test samples at this length; baseline: exact-match chance of a uniform random guess;
# step: training step of the evaluated weights


def load_run(folder: Path, device: torch.device | None = None, use_ema: bool = True):
    """(cfg, task, method, model, step) from a run folder's latest checkpoint."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"run folder {folder} does not exist")
    path = checkpoint.latest(folder)
    if path is None:
        raise UserError(f"{folder} has no checkpoint (is it a run folder written by `lengthgen train`?)")
    state = checkpoint.read_state(path)
    cfg = from_dict(state["config"])
    task, method = get_task(cfg.task.name, **cfg.task.options), get_method(cfg.method)
    device = device or pick_device(cfg.train.device)
    model = method.build_model(cfg, task)
    weights = path / "ema.safetensors"
    checkpoint.load_weights(model, weights if use_ema and weights.exists() else path / "model.safetensors")
    return cfg, task, method, model.to(device).eval(), state["step"]


def eval_generator(seed: int, length: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + length)


@torch.no_grad()
def accuracy_at(task: Task, method: Method, model, length: int, samples: int, batch_size: int,
                seed: int, device: torch.device) -> tuple[float, float]:
    """(exact-match accuracy, token accuracy) over `samples` test samples of one length."""
    generator = eval_generator(seed, length)
    exact_sum = token_sum = 0.0
    done = 0
    while done < samples:
        size = min(batch_size, samples - done)
        batch = task.sample(size, length, generator).to(device)
        exact, token = score(method.predict(model, batch), batch)
        exact_sum += float(exact.float().sum())
        token_sum += float(token.sum())
        done += size
    return exact_sum / samples, token_sum / samples


def evaluate_run(folder: Path, lengths: list[int], samples: int, batch_size: int | None = None,
                 seed: int | None = None, progress: bool = True) -> list[dict]:
    folder = Path(folder)
    cfg, task, method, model, step = load_run(folder)
    device = next(model.parameters()).device
    seed = cfg.eval.seed if seed is None else seed
    batch_size = batch_size or cfg.eval.batch_size
    rows = []
    for length in tqdm(lengths, desc=f"eval {folder.name}", disable=not progress, dynamic_ncols=True):
        try:
            acc, tok = accuracy_at(task, method, model, length, samples, batch_size, seed, device)
        except ValueError as err:  # e.g. a length past the learned position table
            raise UserError(f"cannot evaluate length {length}: {err}") from None
        rows.append(row(folder, cfg, length, samples, acc, tok, task.random_baseline(length), step))
    write_rows(folder / "eval.csv", rows)
    return rows


def row(folder: Path, cfg: Config, length: int, samples: int, acc: float, tok: float,
        baseline: float, step: int) -> dict:
    return {"run": folder.name, "task": cfg.task.name, "method": cfg.method, "position": cfg.model.position,
            "seed": cfg.train.model_seed, "length": length, "n": samples, "accuracy": acc,
            "token_accuracy": tok, "train_max": cfg.task.train_max, "baseline": baseline, "step": step}


def read_rows(path: Path) -> list[dict]:
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    missing = set(COLUMNS) - set(rows[0]) if rows else set()
    if missing:
        raise UserError(f"{path} lacks the columns {sorted(missing)}")
    for r in rows:
        for key in ("seed", "length", "n", "train_max", "step"):
            r[key] = int(r[key])
        for key in ("accuracy", "token_accuracy", "baseline"):
            r[key] = float(r[key])
    return rows


def write_rows(path: Path, rows: list[dict]) -> None:
    """Merge into an existing eval.csv: new rows replace old ones of the same length."""
    path = Path(path)
    new_lengths = {r["length"] for r in rows}
    old = [r for r in read_rows(path) if r["length"] not in new_lengths] if path.exists() else []
    merged = sorted(old + rows, key=lambda r: r["length"])
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in COLUMNS} for r in merged)
    tmp.replace(path)


def format_table(rows: list[dict]) -> str:
    """Plain-text table of one run's rows, lengths beyond training marked."""
    lines = [f"{'length':>7}  {'accuracy':>8}  {'token_acc':>9}  {'random':>8}"]
    for r in rows:
        mark = " *" if r["length"] > r["train_max"] else ""
        lines.append(f"{r['length']:>7}  {r['accuracy']:>8.4f}  {r['token_accuracy']:>9.4f}  {r['baseline']:>8.2g}{mark}")
    if any(r["length"] > r["train_max"] for r in rows):
        lines.append(f"* beyond training (length > train_max = {rows[0]['train_max']})")
    return "\n".join(lines)
