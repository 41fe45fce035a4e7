"""The files of the per-token evaluation of a language-model run: RUN/token_loss.csv (each
scored token's loss at each context), RUN/dependence.csv (a reference run's far tokens found
needed, lengthgen.evaluation.dependence) and RUN/token_eval.json (what they cost, their settings)."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

from lengthgen.results.rows import read_text

DEPENDENCE = "dependence.csv"
TOKEN_LOSS = "token_loss.csv"
TOKEN_EVAL = "token_eval.json"  # what the per-token evaluation and the dependence search cost, and their settings
DEPENDENCE_COLUMNS = ["document", "position", "token", "delta", "in_tau", "in_top", "k", "recovery", "far", "k_random"]


def write_dependence(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=DEPENDENCE_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({**r, "in_tau": int(r["in_tau"]), "in_top": int(r["in_top"]), "far": " ".join(map(str, r["far"])),
                             "delta": f"{r['delta']:.6g}", "recovery": f"{r['recovery']:.6g}"})


def write_token_losses(path: Path, losses: dict[str, np.ndarray]) -> None:
    """RUN/token_loss.csv: document, position, token, then loss_<c> for each context c (nats)."""
    names = list(losses)
    with open(path, "w", newline="") as f:
        f.write(",".join(names) + "\n")
        for values in zip(*(losses[n].tolist() for n in names)):
            f.write(",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values) + "\n")


def read_token_losses(path: Path) -> dict[str, np.ndarray]:
    """token_loss.csv back as columns; a damaged file is a ValueError naming it and the line (bytes
    that are not UTF-8 a UserError naming them; a byte-order mark is dropped)."""
    with io.StringIO(read_text(path), newline="") as f:
        reader = csv.reader(f)
        head = next(reader, None)
        if not head or head[:3] != ["document", "position", "token"] or not all(h.startswith("loss_") for h in head[3:]):
            raise ValueError(f"{path} is not a token_loss.csv (its header is {head!r})")
        values = []
        for line, r in enumerate(reader, start=2):
            try:
                if len(r) != len(head):
                    raise ValueError
                values.append([int(x) for x in r[:3]] + [float(x) for x in r[3:]])
            except ValueError:
                raise ValueError(f"{path} line {line} is damaged") from None
    columns = np.array(values, dtype=np.float64).reshape(-1, len(head)).T
    return {h: (c.astype(np.int64) if i < 3 else c) for i, (h, c) in enumerate(zip(head, columns))}


def read_dependence(path: Path) -> list[dict]:
    with io.StringIO(read_text(path), newline="") as f:  # as read_token_losses
        reader = csv.DictReader(f)
        if reader.fieldnames != DEPENDENCE_COLUMNS:
            raise ValueError(f"{path} is not a dependence.csv (its header is {reader.fieldnames!r})")
        rows = []
        for line, r in enumerate(reader, start=2):
            try:
                rows.append({"document": int(r["document"]), "position": int(r["position"]), "token": int(r["token"]),
                             "delta": float(r["delta"]), "in_tau": r["in_tau"] == "1", "in_top": r["in_top"] == "1",
                             "k": int(r["k"]), "recovery": float(r["recovery"]),
                             "far": [int(d) for d in r["far"].split()], "k_random": int(r["k_random"])})
            except (ValueError, TypeError, AttributeError):
                raise ValueError(f"{path} line {line} is damaged") from None
    return rows


def write_cost(path: Path, key: str, value: dict) -> None:
    """Merge `key` into RUN/token_eval.json."""
    data = {}
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError:
            data = {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1) + "\n")
