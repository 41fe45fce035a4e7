"""How much k(t) depends on how the far tokens are ranked: the search for k again on a reference run
(one evaluated with eval.dependence), far tokens ranked by leave-one-out instead of the run's own
ranking, on at most MAX_TOKENS tokens of its T* (evenly spaced over it; default 100). Leave-one-out
costs 3L passes per token (192 at L = 64) against attention's one, which is why the CPU grid ranks
by attention; this says what that choice changes.

    python scripts/dependence_ranks.py runs/sparsity-lm-cpu/runs/text-long-s0 100 [--out DIR]

Prints, for the same tokens, k under each ranking (median, mean, share with k <= 2 and k <= 8),
how often leave-one-out needs fewer, as many or more far tokens, and the seconds it took.
With --out DIR it also writes DIR/<run>/ as a reference that `lengthgen report` can read: the
run's config.toml, token_loss.csv and eval.csv (its arm renamed <arm>_loo), and the
leave-one-out dependence.csv and token_eval.json, so that

    lengthgen report runs/sparsity-lm-cpu/runs DIR --gain-reference long_loo --out DIR/report

draws G/Δ by the leave-one-out k, each short run paired with the reference of its seed.
"""
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from lengthgen.evaluation.dependence import measure
from lengthgen.evaluation.language_model import Scorer
from lengthgen.results.token_files import (DEPENDENCE, TOKEN_EVAL, TOKEN_LOSS, read_dependence, read_token_losses,
                                           write_cost, write_dependence)
from lengthgen.results.rows import read_labels, read_rows, with_labels, write_rows
from run_args import open_run


def main() -> None:
    out = None
    if "--out" in sys.argv:  # taken out before the arguments every script shares are read
        at = sys.argv.index("--out")
        if at + 1 >= len(sys.argv):
            sys.exit("dependence_ranks: --out needs a folder")
        out = Path(sys.argv[at + 1])
        del sys.argv[at:at + 2]
    folder, counts, cfg, task, method, model = open_run("dependence_ranks", [100])
    folder = Path(folder)
    if not (folder / DEPENDENCE).is_file() or not (folder / TOKEN_LOSS).is_file():
        sys.exit(f"dependence_ranks: {folder} holds no {DEPENDENCE} (a run evaluated with eval.dependence = true)")
    options = {**cfg.eval.dependence_options, "rank": "leave_one_out", "max_tokens": counts[0],
               "random_baseline": False}
    losses = read_token_losses(folder / TOKEN_LOSS)
    start = time.perf_counter()
    with torch.no_grad():
        scorer = Scorer(method, model, cfg.eval.batch_size * cfg.task.train_max, torch.device("cpu"))
        rows, cost = measure(scorer, task.corpus.tokens("test"), losses, cfg.eval.token_contexts, options)
    seconds = time.perf_counter() - start
    if out is not None:
        copy = out / folder.name
        copy.mkdir(parents=True, exist_ok=True)
        for name in ("config.toml", TOKEN_LOSS):
            shutil.copyfile(folder / name, copy / name)
        labels = read_labels(folder)
        labels["arm"] = (labels.get("arm") or "reference") + "_loo"
        write_rows(copy / "eval.csv", with_labels(read_rows(folder / "eval.csv"), labels), old=[])
        (copy / "series.json").write_text(json.dumps(labels) + "\n")
        write_dependence(copy / DEPENDENCE, rows)
        cost["seconds_per_1000_tokens"] = 1000 * seconds / max(len(rows), 1)
        (copy / TOKEN_EVAL).unlink(missing_ok=True)
        write_cost(copy / TOKEN_EVAL, "token_losses", json.loads((folder / TOKEN_EVAL).read_text())["token_losses"])
        write_cost(copy / TOKEN_EVAL, "dependence", cost)
    ranked = {(r["document"], r["position"]): r["k"] for r in read_dependence(folder / DEPENDENCE)}
    pairs = np.array([(ranked[(r["document"], r["position"])], r["k"]) for r in rows])
    own = cfg.eval.dependence_options.get("rank", "attention")
    print(f"{len(pairs)} tokens of T* ∪ T*_p of {folder.name}; leave-one-out took {seconds:.0f} s "
          f"({1000 * seconds / max(len(pairs), 1):.0f} s per 1,000 tokens)\n")
    print("| far tokens ranked by | median k | mean k | k <= 2 | k <= 8 |\n|---|---:|---:|---:|---:|")
    for name, k in ((own, pairs[:, 0]), ("leave_one_out", pairs[:, 1])):
        print(f"| {name} | {np.median(k):.0f} | {k.mean():.1f} | {100 * (k <= 2).mean():.1f} % | {100 * (k <= 8).mean():.1f} % |")
    fewer, same = (pairs[:, 1] < pairs[:, 0]).mean(), (pairs[:, 1] == pairs[:, 0]).mean()
    print(f"\nleave-one-out needs fewer far tokens for {100 * fewer:.1f} %, as many for {100 * same:.1f} %, "
          f"more for {100 * (1 - fewer - same):.1f} % of the tokens")
    if out is not None:
        print(f"wrote {out / folder.name} (arm {labels['arm']})")


if __name__ == "__main__":
    main()
