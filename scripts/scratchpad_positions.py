"""Token accuracy at each place of a multi-operand addition scratchpad: which running sum, which digit.

    python scripts/scratchpad_positions.py RUN_DIR OPERANDS [LENGTH ...]

For every length (digits per operand): the exact match over the run's evaluation samples at
OPERANDS operands, then one row per running sum s_0 .. s_m: the accuracy of each of its W digits
(units first) and, last, of the token after it (the ">" that closes it, or the EOS). Teacher-forced,
as evaluation scores coupled runs. A multi_operand_addition run's scratchpad only.
"""
import sys

import torch

from lengthgen.evaluation.evaluate import eval_batches
from lengthgen.tasks import get_task
from run_args import open_run, predictions, right_answers

SAMPLES = 512

if len(sys.argv) < 3 or not sys.argv[2].isdigit() or not 1 <= int(sys.argv[2]) <= 100:
    sys.exit("scratchpad_positions: usage: scratchpad_positions.py RUN_DIR OPERANDS [LENGTH ...] (operands 1..100)")
operands = int(sys.argv.pop(2))
folder, lengths, cfg, task, method, model = open_run("scratchpad_positions", [], task="multi_operand_addition")
if not task.scratchpad:
    sys.exit(f"scratchpad_positions: {folder} writes the sum alone (scratchpad = false)")
task = get_task(task.name, **{**cfg.task.options, "operands": operands})
print(f"{folder}: {operands} operands, {SAMPLES} samples per length")
for n in lengths or [cfg.task.train_max]:
    batch = next(eval_batches(task, n, SAMPLES, SAMPLES, cfg.eval.seed, torch.device("cpu")))
    pred = predictions(method, model, batch)
    exact = right_answers(method, model, batch, pred).float().mean()
    right = ((pred == batch.targets) | ~batch.scored).float().mean(0)
    width = len(str(operands * (10 ** n - 1)))  # every sample of one length has the same layout
    first = int(batch.question_len[0]) - 1  # the '=' predicts s_0's units digit
    print(f"length {n}: exact {exact:.3f}")
    for k in range(operands + 1):
        place = right[first + k * (width + 1): first + (k + 1) * (width + 1)]
        print(f"  s_{k:<3}" + " ".join(f"{a:.2f}" for a in place.tolist()))
