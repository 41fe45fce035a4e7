"""Delétang et al.'s own training and range evaluation (github.com/google-deepmind/neural_networks_chomsky_hierarchy,
JAX/Haiku), run at lengthgen's cpu-scale budget: tells a missed cpu target's budget from a bug in lengthgen.

It does what their experiments/example.py does, with the budget given on the command line: their task
(constants.TASK_BUILDERS), their model (constants.MODEL_BUILDERS, hidden 256, memory cells of 8 as their
defaults, `--memory-size` cells), make_model_with_empty_targets, their loss and masked accuracy, their
TrainingWorker (Adam after global-norm clipping at 1, lengths uniform on 1..40) and their range
evaluation at every length 1..--max-length on --samples sequences. It prints one JSON line, and writes it
as a record (benchmarks/common/records.py): the score (mean per-token accuracy over lengths 41..max,
their "Network score"), the accuracy at each length and the seconds taken.

    .authors/chomsky-venv/bin/python benchmarks/authors/chomsky_hierarchy.py --task stack_manipulation \\
        --architecture stack_rnn --steps 1000 --batch-size 32 --lr 3e-3 --seed 0

The prepared folder (not in git: .authors/ is ignored):
    .authors/chomsky/neural_networks_chomsky_hierarchy   `git archive 2b8eb4b` of their repository
    .authors/chomsky-venv     python3.11 -m venv; pip install jax jaxlib (0.10.2 on CPython 3.11)
                              dm-haiku==0.0.17 optax einshape==1.0 dm-tree absl-py tqdm numpy
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.common (no torch: it runs in their environment)

from benchmarks.common import records  # noqa: E402

COMMIT = "2b8eb4b"  # the revision exported into .authors/chomsky
# the architectures with a memory: their cores' names for its cell width (8, their default) and size
MEMORY = {"stack_rnn": lambda n: {"stack_cell_size": 8, "stack_size": n},
          "stack_lstm": lambda n: {"stack_cell_size": 8, "stack_size": n},
          "tape_rnn": lambda n: {"memory_cell_size": 8, "memory_size": n}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", required=True)
    p.add_argument("--architecture", required=True,
                   help="their name: rnn, lstm, stack_rnn, tape_rnn, transformer_encoder")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0, help="their seed and model_init_seed")
    p.add_argument("--train-max", type=int, default=40)
    p.add_argument("--max-length", type=int, default=101)
    p.add_argument("--samples", type=int, default=64, help="test sequences per length (their sub-batch is 64)")
    p.add_argument("--memory-size", type=int, default=40, help="stack / tape cells (their example's 40)")
    p.add_argument("--authors", type=Path, default=Path(".authors/chomsky"))
    records.add_arguments(p)
    args = p.parse_args()
    sys.path.insert(0, str(args.authors.resolve()))

    import haiku as hk
    import jax.numpy as jnp
    import numpy as np
    from neural_networks_chomsky_hierarchy.experiments import constants, training, utils
    from neural_networks_chomsky_hierarchy.experiments import curriculum as curriculum_lib

    task = constants.TASK_BUILDERS[args.task]()
    single_output = task.output_length(10) == 1
    model = constants.MODEL_BUILDERS[args.architecture](
        output_size=task.output_size, return_all_outputs=True,
        **({} if "transformer" in args.architecture else {"hidden_size": 256}),
        **MEMORY.get(args.architecture, lambda n: {})(args.memory_size))
    model = hk.transform(utils.make_model_with_empty_targets(model, task, 0, single_output))

    def loss_fn(output, target):
        return jnp.mean(jnp.sum(task.pointwise_loss_fn(output, target), axis=-1)), {}

    def accuracy_fn(output, target):
        mask = task.accuracy_mask(target)
        return jnp.sum(mask * task.accuracy_fn(output, target)) / jnp.sum(mask)

    params = training.ClassicTrainingParams(
        seed=args.seed, model_init_seed=args.seed, training_steps=args.steps, log_frequency=max(1, args.steps // 10),
        length_curriculum=curriculum_lib.UniformCurriculum(values=list(range(1, args.train_max + 1))),
        batch_size=args.batch_size, task=task, model=model, loss_fn=loss_fn, learning_rate=args.lr,
        accuracy_fn=accuracy_fn, compute_full_range_test=True, max_range_test_length=args.max_length,
        range_test_total_batch_size=args.samples, range_test_sub_batch_size=min(64, args.samples))
    start = time.perf_counter()
    _, results, _ = training.TrainingWorker(params, use_tqdm=False).run()
    accuracy = {int(r["length"]): float(r["accuracy"]) for r in results}
    beyond = [a for n, a in accuracy.items() if n > args.train_max]
    kept = {k: v for k, v in vars(args).items() if k not in ("authors", "json", "no_record", "note")}
    result = {"commit": COMMIT, **kept, "score": float(np.mean(beyond)),
              "seconds": round(time.perf_counter() - start, 1), "accuracy": accuracy}
    print(json.dumps(result))
    records.write(__file__, args, result, device="cpu")


if __name__ == "__main__":
    main()
