"""Flip-flop language modelling: sequences and read bits against a brute-force reader,
its layout (scored inside the sequence), its distributions and its own metrics."""
import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.tasks import IGNORE, PAD, get_task

from tests.helpers.task_checks import solve_flipflop


def reads_of(task, batch, i):
    question, answer = task.to_text(batch, i)
    return question, answer


@pytest.mark.parametrize("p_ignore", [0.8, 0.98, 0.1, 0.0])
def test_read_bits_against_a_brute_force_reader(p_ignore):
    task = get_task("flipflop", p_ignore=p_ignore)
    g = torch.Generator().manual_seed(1)
    for n in (2, 3, 7, 64, 256):
        batch = task.sample(200, n, g)
        for i in range(len(batch)):
            question, answer = task.to_text(batch, i)
            assert answer == solve_flipflop(question, n)[0], (question, answer)


def test_mixed_lengths_and_layout():
    task = get_task("flipflop")
    lengths = torch.tensor([2, 9, 300, 5, 2, 64])
    batch = task.sample(len(lengths), lengths, torch.Generator().manual_seed(2))
    assert torch.equal(batch.lengths, lengths)
    assert batch.inputs.shape[1] == 2 * 300 - 1 and torch.equal(batch.widths, 2 * lengths - 1)
    r = task.token_id("r")
    for i, n in enumerate(lengths.tolist()):
        question, answer = task.to_text(batch, i)
        assert len(question) == 2 * n - 1 and answer == solve_flipflop(question, n)[0]
        assert (batch.inputs[i, 2 * n - 1:] == PAD).all() and (batch.targets[i, 2 * n - 1:] == IGNORE).all()
        # scored exactly at the r tokens, each target the bit after it
        assert torch.equal(batch.scored[i, :2 * n - 1], batch.inputs[i, :2 * n - 1] == r)
        bits = batch.targets[i][batch.scored[i]]
        assert task.decode(bits) == answer
        inside = batch.scored[i].nonzero().flatten()[:-1]  # all reads but the last have their bit as an input
        assert torch.equal(batch.inputs[i, inside + 1], batch.targets[i, inside])


def test_loss_all_scores_every_next_character():
    task = get_task("flipflop", loss="all")
    batch = task.sample(50, 20, torch.Generator().manual_seed(3))
    assert batch.scored.all()  # 39 inputs, 39 next characters
    assert torch.equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    reads = get_task("flipflop").sample(50, 20, torch.Generator().manual_seed(3))
    assert torch.equal(reads.inputs, batch.inputs)  # the same sequences; only what is scored differs


def test_instruction_frequencies_follow_p_ignore():
    for p_ignore in (0.8, 0.1):
        batch = get_task("flipflop", p_ignore=p_ignore).sample(2000, 50, torch.Generator().manual_seed(4))
        instr = batch.inputs[:, 0::2]  # (B, 50): pair 49's r is at column 98
        task = get_task("flipflop")
        assert (instr[:, 0] == task.token_id("w")).all() and (instr[:, 49] == task.token_id("r")).all()
        middle = instr[:, 1:49]
        share = {t: float((middle == task.token_id(t)).float().mean()) for t in "wri"}
        assert share["i"] == pytest.approx(p_ignore, abs=0.01)
        assert share["w"] == pytest.approx((1 - p_ignore) / 2, abs=0.01) == share["r"]
        bits = batch.inputs[:, 1::2]
        assert float((bits == task.token_id("1")).float().mean()) == pytest.approx(0.5, abs=0.01)


def test_metrics_count_reads_only():
    for loss in ("reads", "all"):
        task = get_task("flipflop", loss=loss)
        batch = task.sample(64, 30, torch.Generator().manual_seed(5))
        right = task.metrics(batch.targets.clamp(min=0), batch)
        assert (right["glitch_rate"] == 0).all() and (right["sequence_accuracy"] == 1).all()
        one = task.token_id("1")
        pred = torch.full_like(batch.targets, one)  # always read 1
        got = task.metrics(pred, batch)
        for i in range(len(batch)):
            _, answer = task.to_text(batch, i)
            assert float(got["glitch_rate"][i]) == pytest.approx(answer.count("0") / len(answer))
            assert float(got["sequence_accuracy"][i]) == float("0" not in answer)


def test_example_length_and_options_are_checked():
    task = get_task("flipflop")
    question, answer = task.example.split(" -> ")
    assert solve_flipflop(question, (len(question) + 1) // 2)[0] == answer
    with pytest.raises(ValueError, match="length must be >= 2"):
        task.sample(4, 1, torch.Generator())
    for bad in ({"p_ignore": 1.0}, {"p_ignore": "high"}, {"loss": "some"}):
        with pytest.raises(ValueError):
            get_task("flipflop", **bad)
    assert task.random_baseline(10) < 0.5  # at least two reads: 2^-reads


def test_config_refuses_lengths_below_two_and_answer_methods():
    sets = ["task.name=flipflop", "task.train_min=2", "task.train_max=8", "eval.lengths=2:8"]
    assert new_run_config(None, sets).task.name == "flipflop"
    for extra, needle in ((["task.train_min=1"], "task.train_min must be >= 2"),
                          (["eval.lengths=1:8"], "eval.lengths includes 1"),
                          (["method=looped"], "scored inside the sequence"),
                          (["method=ntp-pause"], "scored inside the sequence"),
                          (["eval.sweep={p_ignore=[0.8, 0.98, 0.1]}"], None)):
        if needle is None:
            assert new_run_config(None, sets + extra).eval.sweep == {"p_ignore": [0.8, 0.98, 0.1]}
            continue
        with pytest.raises(Exception, match=needle):
            new_run_config(None, sets + extra)
