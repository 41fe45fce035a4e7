"""Token accuracy at each answer position of a trained run: where its answers go wrong.

    python scripts/answer_positions.py RUN_DIR [LENGTH ...]

For every length: the exact match, then the accuracy of the 1st, 2nd, ...
answer token (in the order the task writes its answer; an answer that ends
with EOS counts it as a token), each over the samples whose answer is that
long. Uses the run's evaluation seed and 2048 samples per length (the 512 of
`lengthgen eval`, then more), the oracle stop for looped runs and greedy
decoding otherwise. On Addition (MSB first) the first token is the carry out,
the last the sum of the two lowest bits, which needs no carry at all.
"""
import torch

from lengthgen.evaluation.evaluate import eval_batches
from run_args import open_run, predictions, right_answers

SAMPLES = 2048

folder, lengths, cfg, task, method, model = open_run("answer_positions", [8, 12, 16])
print(f"{folder} ({cfg.method}, {task.name}); {SAMPLES} samples per length")
print("length  exact  token accuracy at answer position 1, 2, ...")
for n in lengths:
    batch = next(eval_batches(task, n, SAMPLES, SAMPLES, cfg.eval.seed, torch.device("cpu")))
    pred = predictions(method, model, batch)
    exact = right_answers(method, model, batch, pred).float().mean()
    first = batch.question_len - 1  # the '=' position predicts the first answer token
    width = int(batch.scored.sum(1).max())
    cols = first[:, None] + torch.arange(width)[None, :]  # (B, width): answer position k of each row
    inside = cols < batch.targets.shape[1]  # a long question with a short answer can end before its k-th column
    cols = cols.clamp(max=batch.targets.shape[1] - 1)
    scored = batch.scored.gather(1, cols) & inside
    right = (pred.gather(1, cols) == batch.targets.gather(1, cols)) & scored
    per_position = right.sum(0) / scored.sum(0).clamp(min=1)
    print(f"{n:>6}  {exact:.3f}  " + " ".join(f"{a:.2f}" for a in per_position.tolist()))
