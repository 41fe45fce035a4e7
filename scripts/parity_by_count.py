"""Accuracy of a trained parity run split by the number of ones in the input.

    python scripts/parity_by_count.py RUN_DIR [LENGTH ...]

A model that has learned a length-general parity algorithm is right on every
count; one that maps counts seen in training to their parity fails exactly on
the counts it rarely or never saw.
"""
from lengthgen.evaluation.evaluate import eval_generator
from run_args import open_run, right_answers

folder, lengths, cfg, task, method, model = open_run("parity_by_count", [12, 16], task="parity")
one = task.token_id("1")
for n in lengths:
    batch = task.sample(2000, n, eval_generator(cfg.eval.seed, n))
    right = right_answers(method, model, batch)
    ones = (batch.inputs[:, :n] == one).sum(1)
    cells = [f"{c}:{right[ones == c].float().mean():.2f}" for c in range(n + 1) if (ones == c).sum() >= 10]
    print(f"length {n}: accuracy {right.float().mean():.3f}; by count of ones (>= 10 samples): {' '.join(cells)}")
