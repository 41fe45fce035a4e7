"""The attention weights of a trained run on one test sequence, as arrays for the report's
attention figure (lengthgen.reporting.figures.plot_attention draws them)."""
from __future__ import annotations

from pathlib import Path

import torch

from lengthgen.evaluation.evaluate import eval_generator, load_run
from lengthgen.model.attention import recording
from lengthgen.tasks import task_of


def attention_map(folder: Path, options: dict | None = None, length: int | None = None) -> dict:
    """One test sequence of the run in `folder` (its eval seed, at `length`, default its training
    maximum, with task `options` changed): weights (layers, heads, scored positions, keys) as a
    numpy array, each scored position's source input (Task.source_positions, or None), how many
    scored positions the model got right, the sequence as text, the task and the length."""
    cfg, task, _, model, _ = load_run(folder, torch.device("cpu"))
    task = task_of(cfg.task, **options) if options else task  # the run's own unless options change it
    n = length or cfg.task.train_max
    batch = task.sample(1, n, eval_generator(cfg.eval.seed, n))
    width = int(batch.widths[0])
    with torch.no_grad(), recording(model) as recorder:
        pred = model(batch.inputs[:, :width], None if batch.position_ids is None else batch.position_ids[:, :width])
    scored = batch.scored[0, :width].nonzero().flatten()
    weights = torch.stack([torch.cat(chunks, 2)[0][:, scored] for _, chunks in sorted(recorder.weights.items())])
    sources = task.source_positions(batch)
    return {"weights": weights.float().numpy(), "sources": None if sources is None else sources[0, scored].numpy(),
            "width": width, "right": int((pred.argmax(-1)[0, scored] == batch.targets[0, scored]).sum()),
            "sequence": task.decode(batch.inputs[0, :width]), "task": task.name, "length": n}
