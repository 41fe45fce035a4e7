"""Predictive Position Coupling: the loss, decoding with predicted IDs, what it needs of a
config, and a tiny run that learns to predict the IDs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import ConfigError
from lengthgen.evaluation.evaluate import evaluate_run, load_run
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.methods.ppc import predicted_id
from lengthgen.methods.registry import get_method
from lengthgen.model.generate import generate_answers, greedy
from lengthgen.reporting.report import write_report
from lengthgen.tasks import IGNORE, Batch, get_task
from lengthgen.training.trainer import train

PPC = ["method=ppc", "task.name=decimal_addition", "task.options.coupled=true", "task.train_min=1",
       "task.train_max=4", "model.position=learned", "model.max_positions=16", "model.d_model=32",
       "model.n_layer=1", "model.n_head=4", "model.init=torch", "data.position_transform=random_offset",
       "data.position_transform_options={max_position=15, keep_zero=true}", "train.device=cpu",
       "train.batch_size=32", "optim.lr=3e-3", "train.log_interval=50", "eval.lengths=2,4"]


def model_and_batch(weight: float = 1.0):
    cfg = new_run_config(None, PPC + [f"method_options.id_loss_weight={weight}"])
    task = get_task("decimal_addition", coupled=True)
    torch.manual_seed(0)
    return get_method("ppc").build_model(cfg, task).eval(), task.sample(8, 3, torch.Generator().manual_seed(0))


def test_the_loss_adds_the_id_cross_entropy_times_its_weight():
    method = get_method("ppc", new_run_config(None, PPC + ["method_options.id_loss_weight=0.5"]))
    model, batch = model_and_batch(0.5)
    h = method.hidden(model, batch)
    tokens = F.cross_entropy(model.lm_head(h).flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)
    ids = F.cross_entropy(model.id_head(h).flatten(0, 1), batch.target_ids.flatten(), ignore_index=IGNORE)
    assert ids > 0.1
    assert method.loss(model, batch).item() == pytest.approx((tokens + 0.5 * ids).item(), rel=1e-5)


def test_generated_tokens_take_the_predicted_ids():
    """Each generated token's ID is the ID head's argmax at the token before it, as a full
    pass over the prompt and the generated tokens, with those IDs, computes it; and the
    cached decoding equals the recomputed one."""
    method = get_method("ppc")
    model, batch = model_and_batch()
    pred = method.predict(model, batch)
    assert torch.equal(pred, generate_answers(model, batch, predicted_id, use_cache=False))
    q = int(batch.question_len[0])
    prompt, prompt_ids = batch.inputs[:, :q], batch.position_ids[:, :q]
    tokens, ids = greedy(model, prompt, prompt_ids, 4, predicted_id)
    with torch.no_grad():
        h = method.hidden(model, Batch(inputs=torch.cat([prompt, tokens], 1), targets=batch.targets,
                                       question_len=batch.question_len, lengths=batch.lengths,
                                       n_steps=batch.n_steps, position_ids=torch.cat([prompt_ids, ids], 1)))
    assert torch.equal(model.id_head(h)[:, q - 1:q + 3].argmax(-1), ids)
    assert torch.equal(model.lm_head(h)[:, q - 1:q + 3].argmax(-1), tokens)


@pytest.mark.parametrize("overrides, message", [
    (["task.options.coupled=false"], "does not supply"),
    (["data.position_transform=pose", "data.position_transform_options={target_length=16}"], "random_offset"),
    (["model.position=alibi"], "KV cache"),
    (["model.position=rope"], "model.position rope never shows the model"),
    (["model.max_positions=12"], "model.max_positions (12)"),
])
def test_what_ppc_needs_of_a_config(overrides, message):
    with pytest.raises(ConfigError) as err:
        new_run_config(None, PPC + overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_a_tiny_run_learns_the_next_ids(tmp_path):
    """The IDs of the next digit follow a rule; 400 steps must learn them on held-out
    samples at a trained length (chance: 1 in 16; 1.000 on four seeds tried)."""
    folder = tmp_path / "run"
    train(new_run_config(None, PPC + ["train.steps=400", "method_options.id_loss_weight=5.0"]), folder, progress=False)
    model = load_run(folder)[3]
    batch = get_task("decimal_addition", coupled=True).sample(64, 4, torch.Generator().manual_seed(99))
    with torch.no_grad():
        h = get_method("ppc").hidden(model, batch)
        guess = model.id_head(h).argmax(-1)
    scored = batch.target_ids != IGNORE
    assert (guess[scored] == batch.target_ids[scored]).float().mean() > 0.95
    # the evaluation reports it: eval.csv's id_accuracy column, in the per-task report table
    rows = evaluate_run(folder, EvalSettings(lengths=[4], samples=64, progress=False))
    assert rows[0]["id_accuracy"] > 0.95 and rows[0]["id_accuracy"] <= 1.0
    report = write_report([folder], tmp_path / "report").read_text()
    assert "`id_accuracy`" in report
