"""Accuracy of a trained multiplication run split by the short factor a.

    python scripts/multiplication_by_a.py RUN_DIR [LENGTH ...]

a is written with 1 or 2 bits, so each test set mixes six problems: a = 0 or
00 (the answer is all zeros), a = 1 or 01 (b reversed), a = 10 (b reversed
and shifted) and a = 11 (b + 2b, the only one with carries). Split this way,
the exact match shows which of them a run still solves beyond its training
lengths. Uses the run's evaluation seed, 2048 samples per length (the 512 of
`lengthgen eval`, then more; a quarter of them have 1-bit a = 0, a quarter
a = 1, an eighth each 2-bit value), the oracle stop for looped runs and greedy
decoding for ntp.
"""
import torch

from lengthgen.evaluation.evaluate import eval_batches
from run_args import open_run, right_answers

A_VALUES = ("0", "1", "00", "01", "10", "11")

folder, lengths, cfg, task, method, model = open_run("multiplication_by_a", [8, 12, 16], task="multiplication")
star = task.token_id("*")
print(f"{folder} ({cfg.method})")
print("exact match (samples) at each length: all, then by the value of a as written")
print("length  all          " + "  ".join(f"{'a=' + a:<11}" for a in A_VALUES))
for n in lengths:
    batch = next(eval_batches(task, n, 2048, 2048, cfg.eval.seed, torch.device("cpu")))
    right = right_answers(method, model, batch)
    a_len = (batch.inputs == star).int().argmax(1)  # a's bits come before '*'
    a_text = ["".join(task.vocab[t] for t in row[:k].tolist()) for row, k in zip(batch.inputs, a_len)]
    cells = []
    for a in A_VALUES:
        group = torch.tensor([text == a for text in a_text])
        cells.append(f"{right[group].float().mean():.3f} ({int(group.sum()):>3})" if group.any() else f"{'-':<11}")
    print(f"{n:>6}  {right.float().mean():.3f} ({len(right)})  " + "  ".join(cells))
