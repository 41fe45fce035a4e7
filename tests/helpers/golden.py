"""Golden runs: a tiny run of each method family (looped, next-token, a TRA scheme, PPC) trained
and evaluated through the CLI, its per-step losses and evaluation rows pinned in
tests/helpers/golden.json. A change that should not change behaviour (a module moved, a rule moved into
its class) must leave them as they are. After a change that is meant to alter them, regenerate:

    .venv/bin/python tests/helpers/golden.py
"""
from __future__ import annotations

import csv
import json
import sys
import tempfile
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden.json"
TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.batch_size=8", "train.steps=10",
        "train.log_interval=1", "train.checkpoint_interval=100", "train.device=cpu", "optim.lr=3e-3",
        "eval.samples=32", "eval.lengths=2,4,8", "task.train_max=4"]
FAMILIES = {
    "looped": ["method=looped", "task.name=parity"],
    "ntp": ["task.name=copy"],
    "tra": ["task.name=copy", "model.position=tra"],
    "ppc": ["method=ppc", "task.name=unique_set", "task.options={symbols=8, coupled=true}",
            "model.position=learned", "model.max_positions=24", "data.position_transform=random_offset",
            "data.position_transform_options={max_position=16, keep_zero=true}"],
}


def run(family: str, folder: Path) -> dict:
    """{"losses": [...], "eval": [{column: value}, ...]} of the family's tiny run in `folder`."""
    from lengthgen.cli import main

    sets = [f"--set={s}" for s in TINY + FAMILIES[family]]
    assert main(["train", "--defaults", *sets, "--out", str(folder), "--no-progress"]) == 0
    assert main(["eval", str(folder), "--no-progress"]) == 0
    losses = [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()
              if "loss" in json.loads(line)]
    with open(folder / "eval.csv", newline="") as f:
        rows = [{k: v for k, v in row.items() if k not in ("seconds", "time")} for row in csv.DictReader(f)]
    return {"losses": losses, "eval": rows}


if __name__ == "__main__":
    sys.path.insert(0, str(GOLDEN.parents[2]))  # the checkout's lengthgen, installed or not
    with tempfile.TemporaryDirectory() as tmp:
        golden = {family: run(family, Path(tmp) / family) for family in FAMILIES}
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
