"""The `encoder` method (lengthgen.methods.encoder): whole-answer prediction from the suite's tape,
with no answer token and no padding reaching a real column, whatever the batch's widths."""
from __future__ import annotations

import torch

from lengthgen.assembly.runs import new_run
from lengthgen.tasks import BLANK, IGNORE, Batch


def encoder_run(task: str = "reverse_string", causal: bool = False):
    run = new_run(None, ["method=encoder", f"task.name={task}", f"model.causal={str(causal).lower()}", "model.d_model=16",
                         "model.n_head=2", "model.n_layer=2", "model.position=rope"])
    torch.manual_seed(0)
    return run, run.method.build_model(run.cfg, run.task).eval()


def test_the_model_reads_the_inputs_and_blank_slots_only():
    run, model = encoder_run()
    batch = run.task.sample(4, 6, torch.Generator().manual_seed(0))
    tape = run.method.model_batch(batch)
    slots = batch.scored
    assert (tape.inputs[slots] == BLANK).all() and (tape.inputs[~slots][:, None] != BLANK).all()
    answers = torch.arange(batch.inputs.shape[1])[None, :] >= batch.question_len[:, None]  # the answer inputs
    other = Batch(**{**batch.__dict__, "inputs": torch.where(answers, 3, batch.inputs)})
    assert torch.allclose(run.method.logits(model, batch), run.method.logits(model, other), atol=0)  # answers unseen


def test_rows_of_mixed_widths_read_as_each_row_alone():
    run, model = encoder_run("duplicate_string")
    g = torch.Generator().manual_seed(1)
    rows = [run.task.sample(1, n, g) for n in (2, 5, 3, 5)]
    mixed = Batch.concat(rows)
    logits = run.method.logits(model, mixed)
    for b, row in enumerate(rows):
        alone = run.method.logits(model, row)[0]
        w = alone.shape[0]
        scored = row.targets[0] != IGNORE
        assert torch.allclose(logits[b, :w][scored], alone[scored], atol=1e-5)


def test_the_loss_trains_the_slots():
    run, model = encoder_run("parity_check")
    model.train()
    batch = run.task.sample(8, 5, torch.Generator().manual_seed(2))
    loss = run.method.loss(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert run.method.predict(model, batch).shape == batch.targets.shape
