"""Tiny runs of the recurrent baselines that must learn and generalise beyond their training
lengths, as Delétang et al. report (an LSTM solves the regular tasks, a Stack-RNN the
deterministic context-free ones): each trained by lengthgen's trainer, read back from its
checkpoint and scored at up to 4x the longest training length."""
import pytest
import torch

from lengthgen.assembly.runs import new_run_config


def trained(folder, method, task, train_max, d_model, steps, lr):
    """(task, method, model) of a run trained into `folder` and loaded back."""
    from lengthgen.evaluation.evaluate import load_run
    from lengthgen.training.trainer import train
    cfg = new_run_config(None, [
        f"method={method}", f"task.name={task}", f"task.train_max={train_max}", f"model.d_model={d_model}",
        f"train.steps={steps}", f"optim.lr={lr}", "train.batch_size=32", "optim.weight_decay=0",
        "optim.schedule=constant", f"train.log_interval={steps}", f"train.checkpoint_interval={steps}",
        "train.device=cpu"])
    train(cfg, folder, progress=False)
    _, task, method, model, _ = load_run(folder, torch.device("cpu"))
    return task, method, model


def token_accuracy(task, method, model, n):
    batch = task.sample(256, n, torch.Generator().manual_seed(7))
    with torch.no_grad():
        return float(method.values(model, batch, task, method.predict(model, batch))["chomsky_accuracy"].mean())


def test_lstm_learns_parity_check_beyond_its_training_lengths(tmp_path):
    """1,500 steps reach 1.0 at 10, 20 and 40; 1,000 steps left this seed at 0.69 / 0.51 / 0.47
    (seed 1 solved it) and 600 both seeds near chance (2026-12-07): no smaller budget."""
    task, method, model = trained(tmp_path / "run", "lstm", "parity_check", 10, 64, 1500, 3e-3)
    for n in (10, 20, 40):
        assert token_accuracy(task, method, model, n) >= 0.95, n


@pytest.mark.slow
def test_stack_rnn_learns_reverse_string_beyond_its_training_lengths(tmp_path):
    """Seeds 0 and 1 reach 1.0 at 16, 32 and 64 after 300 steps (seed 0 already after 150) as after
    1,000 and 2,000; after 50 steps seed 0 scores 0.66 / 0.58 / 0.55, and an LSTM (no stack) at
    this budget 0.64 / 0.56 / 0.53, so the test fails without the stack (2026-12-07). Seed 2
    stays near 0.91 / 0.71 / 0.60 at 2,000 (like the paper, which reports the best of 10 seeds,
    not every seed solves it at this budget). Shorter training (lengths up to 10) let the hidden
    state memorise instead of using the stack."""
    task, method, model = trained(tmp_path / "run", "stack-rnn", "reverse_string", 16, 32, 300, 1e-2)
    for n in (16, 32, 64):
        assert token_accuracy(task, method, model, n) >= 0.95, n
