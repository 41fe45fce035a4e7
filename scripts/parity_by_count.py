"""Accuracy of a trained parity run split by the number of ones in the input.

    python scripts/parity_by_count.py RUN_DIR [LENGTH ...]

A model that has learned a length-general parity algorithm is right on every
count; one that maps counts seen in training to their parity fails exactly on
the counts it rarely or never saw.
"""
import sys

import torch

from lengthgen.errors import UserError
from lengthgen.evaluate import eval_generator, load_run

try:
    if len(sys.argv) < 2 or not all(a.isdigit() and int(a) > 0 for a in sys.argv[2:]):
        raise UserError("usage: parity_by_count.py RUN_DIR [LENGTH ...] (lengths: positive integers)")
    folder, lengths = sys.argv[1], [int(n) for n in sys.argv[2:]] or [12, 16]
    cfg, task, method, model, _ = load_run(folder, torch.device("cpu"))
    if task.name != "parity":
        raise UserError(f"{folder} is a {task.name!r} run; this split needs a parity one")
except UserError as err:
    sys.exit(f"parity_by_count: {err}")
one = task.token_id("1")
for n in lengths:
    batch = task.sample(2000, n, eval_generator(cfg.eval.seed, n))
    with torch.no_grad():
        pred = method.predict_stop(model, batch, "oracle")[0] if hasattr(method, "predict_stop") \
            else method.predict(model, batch)
    right = ((pred == batch.targets) | ~batch.scored).all(1)
    ones = (batch.inputs[:, :n] == one).sum(1)
    cells = [f"{c}:{right[ones == c].float().mean():.2f}" for c in range(n + 1) if (ones == c).sum() >= 10]
    print(f"length {n}: accuracy {right.float().mean():.3f}; by count of ones (>= 10 samples): {' '.join(cells)}")
