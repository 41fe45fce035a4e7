"""Why per-sample confidence stopping picks the step it picks, on a looped run.

    python scripts/confidence_ranks.py RUN_DIR [LENGTH ...]

For each length, on 512 samples drawn in one batch from the run's evaluation
seed (the draw the numbers in docs/results/looped.md were measured on; `lengthgen
eval` draws its test set 256 at a time, so its samples differ): the
share of samples whose right step T(n) is their most confident one (what
per-sample stopping needs), the median confidence loss at the right step and at
iteration 1, and per iteration t <= 2 T(n) how many samples are strictly more
confident at t than at their right step, and how many of those are wrong at t.
"""
from lengthgen.evaluation.evaluate import eval_generator
from lengthgen.methods.looped.block import per_sample_steps
from lengthgen.methods.looped.stop_passes import trace
from run_args import open_run

folder, lengths, cfg, task, method, model = open_run("confidence_ranks", [12, 24], looped=True)
for n in lengths:
    batch = task.sample(512, n, eval_generator(cfg.eval.seed, n))
    right_step = per_sample_steps(batch)  # (B,)
    tr = trace(model, batch, 2 * int(right_step.max()))
    at_right = tr.confidence.gather(0, (right_step - 1)[None])[0]  # (B,)
    beats = tr.confidence < at_right[None]  # (T, B)
    print(f"length {n}: right step most confident for {(~beats.any(0)).float().mean():.2f} of samples; "
          f"median loss at the right step {at_right.median():.1e}, at iteration 1 {tr.confidence[0].median():.1e}")
    print("  t: samples more confident than at their right step (of them wrong at t)")
    print("  " + " ".join(f"{t + 1}:{int(beats[t].sum())}({int((beats[t] & ~tr.exact[t]).sum())})"
                          for t in range(len(beats))))
