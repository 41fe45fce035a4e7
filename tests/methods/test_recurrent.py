"""The recurrent baselines (lengthgen.model.recurrent, lengthgen.methods.recurrent) against their
definitions (Delétang et al., ICLR 2023, and the authors' Haiku code): the stack and tape updates
on hand-worked examples, each model's step against the equations written out sample by sample,
Haiku's initial values, and the authors' tape protocol (the model never sees an answer token)."""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.assembly.runs import new_run, new_run_config
from lengthgen.errors import ConfigError
from lengthgen.methods.registry import METHODS, get_method
from lengthgen.model.recurrent import (CELL_SIZE, LSTM, RNN, StackRNN, TapeRNN, jump_indices, stack_update,
                                       tape_update)
from lengthgen.tasks import BLANK, get_task

RECURRENT = ("rnn", "lstm", "stack-rnn", "tape-rnn")


def model_config(d_model=16):
    return new_run_config(None, [f"model.d_model={d_model}"]).model


def test_the_four_baselines_are_registered_under_the_grid_s_names():
    for name in RECURRENT:
        method = METHODS[name]
        assert method.name == name and method.needs_answer_region
        assert not method.accepts_position_ids and not method.has_positions


# --- the stack, by hand --------------------------------------------------------------------------

STACK = torch.tensor([[1., 2.], [3., 4.], [5., 6.]])  # top (cell 0) first, cells of width 2
PUSHED = torch.tensor([10., 20.])


def stacked(actions):
    return stack_update(STACK[None, None], torch.tensor(actions)[None, None], PUSHED[None, None])[0, 0]


def test_a_pure_push_pop_and_no_op_move_the_stack_as_a_stack():
    assert torch.equal(stacked([1., 0., 0.]), torch.tensor([[10., 20.], [1., 2.], [3., 4.]]))  # the bottom falls off
    assert torch.equal(stacked([0., 1., 0.]), torch.tensor([[3., 4.], [5., 6.], [0., 0.]]))  # zeros come in
    assert torch.equal(stacked([0., 0., 1.]), STACK)


def test_a_mixed_stack_action_is_the_paper_s_weighted_sum_worked_by_hand():
    """push 0.5, pop 0.3, no-op 0.2 (the authors' order):
    s'[0] = .5 v    + .3 s[1] + .2 s[0] = (5 + .9 + .2, 10 + 1.2 + .4) = (6.1, 11.6)
    s'[1] = .5 s[0] + .3 s[2] + .2 s[1] = (.5 + 1.5 + .6, 1 + 1.8 + .8) = (2.6, 3.6)
    s'[2] = .5 s[1] + .3 * 0  + .2 s[2] = (1.5 + 1, 2 + 1.2)            = (2.5, 3.2)"""
    assert torch.allclose(stacked([.5, .3, .2]), torch.tensor([[6.1, 11.6], [2.6, 3.6], [2.5, 3.2]]))


# --- the tape, by hand ---------------------------------------------------------------------------

TAPE = torch.tensor([1., 2., 3., 4., 5.])  # one cell value each, the head on cell 0 of a ring of 5
# after writing 9 to the head's cell, M' = 9 2 3 4 5; each move, by hand (M_t[m] = M'[(m + delta) mod 5]):
MOVED_L2 = {"stay": [9, 2, 3, 4, 5], "left": [2, 3, 4, 5, 9], "right": [5, 9, 2, 3, 4],
            "jump left": [3, 4, 5, 9, 2], "jump right": [4, 5, 9, 2, 3]}  # input length l = 2
MOVED_L1 = {**MOVED_L2, "jump left": MOVED_L2["left"], "jump right": MOVED_L2["right"]}  # l = 1


def taped(actions, lengths=(2,)):
    B = len(lengths)
    tape = TAPE.expand(B, 1, 5)[..., None]  # (B, N=1, S=5, d=1)
    jumps = jump_indices(torch.tensor(lengths), 5)
    acts = torch.tensor(actions).expand(B, 1, 5)
    return tape_update(tape, acts, torch.full((B, 1, 1), 9.), jumps)[:, 0, :, 0]


def test_each_pure_tape_action_writes_then_moves_the_ring_under_the_head():
    for k, move in enumerate(MOVED_L2):
        one_hot = [float(i == k) for i in range(5)]
        assert torch.equal(taped(one_hot), torch.tensor([MOVED_L2[move]], dtype=torch.float)), move


def test_a_mixed_tape_action_is_the_weighted_sum_and_jumps_follow_each_row_s_input_length():
    p = [.1, .2, .3, .15, .25]
    for lengths, row in (((2,), MOVED_L2), ((1,), MOVED_L1)):
        by_hand = sum(pk * torch.tensor(v, dtype=torch.float) for pk, v in zip(p, row.values()))
        assert torch.allclose(taped(p, lengths)[0], by_hand)
    both = taped(p, (2, 1))  # one batch, two input lengths
    assert torch.allclose(both[0], taped(p, (2,))[0]) and torch.allclose(both[1], taped(p, (1,))[0])
    assert not torch.allclose(both[0], both[1])


# --- each model's step, written out sample by sample ----------------------------------------------

def relu_rnn_step(read_in, recur, x, read, h):
    """hk.VanillaRNN on [x; read]: ReLU(W_i [x; read] + b_i + W_h h + b_h)."""
    return F.relu(read_in.weight @ torch.cat([x, read]) + read_in.bias + recur.weight @ h + recur.bias)


def reference_memory_run(model, tokens, length, update):
    """The model's hidden states on one row `tokens`, its memory updated by `update(memory, h)`
    written with explicit loops over cells."""
    V, T = model.vocab_size, len(tokens)
    memory = torch.zeros(T, CELL_SIZE)
    h, out = torch.zeros(model.hidden), []
    for t in range(T):
        h = relu_rnn_step(model.read_in, model.recur, F.one_hot(tokens[t], V).float(), memory[0], h)
        memory = update(memory, h)
        out.append(h)
    return torch.stack(out)


def test_the_stack_rnn_reads_the_last_top_and_updates_its_stack_by_the_equations():
    torch.manual_seed(0)
    model = StackRNN(model_config(), 7)
    tokens = torch.tensor([[3, 4, 4, 5, 2, 2], [4, 3, 5, 2, 2, 0]])

    def update(s, h):
        push, pop, noop = model.actions(h).softmax(-1)
        v = model.push(h)
        new = torch.zeros_like(s)
        for i in range(len(s)):
            above = v if i == 0 else s[i - 1]
            below = s[i + 1] if i + 1 < len(s) else torch.zeros(CELL_SIZE)
            new[i] = push * above + pop * below + noop * s[i]
        return new

    got = model.run(F.one_hot(tokens, 7).float(), torch.tensor([3, 2]))
    for b in range(2):
        assert torch.allclose(got[b], reference_memory_run(model, tokens[b], 0, update), atol=1e-5)


def test_the_tape_rnn_writes_an_mlp_value_and_moves_by_the_equations():
    torch.manual_seed(1)
    model = TapeRNN(model_config(), 7)
    tokens = torch.tensor([[3, 4, 4, 5, 2, 2, 2], [4, 3, 5, 2, 2, 0, 0]])
    lengths = torch.tensor([3, 2])

    def update_for(length):
        def update(m, h):
            p = model.actions(h).softmax(-1)
            written = m.clone()
            written[0] = model.write(h)
            S = len(m)
            deltas = (0, 1, -1, length, -length)
            return torch.stack([sum(p[a] * written[(i + deltas[a]) % S] for a in range(5)) for i in range(S)])
        return update

    got = model.run(F.one_hot(tokens, 7).float(), lengths)
    for b in range(2):
        want = reference_memory_run(model, tokens[b], int(lengths[b]), update_for(int(lengths[b])))
        assert torch.allclose(got[b], want, atol=1e-5)


def test_the_rnn_is_haiku_s_relu_rnn_and_the_lstm_has_its_forget_bias():
    torch.manual_seed(2)
    cfg = model_config()
    rnn, lstm = RNN(cfg, 5), LSTM(cfg, 5)
    x = F.one_hot(torch.tensor([[3, 4, 2]]), 5).float()
    core = rnn.core
    h, want = torch.zeros(16), []
    for t in range(3):
        h = F.relu(core.weight_ih_l0 @ x[0, t] + core.bias_ih_l0 + core.weight_hh_l0 @ h + core.bias_hh_l0)
        want.append(h)
    assert torch.allclose(rnn.run(x, None)[0], torch.stack(want), atol=1e-6)
    c = lstm.core
    assert torch.equal(c.bias_ih_l0[16:32], torch.ones(16)) and not c.bias_ih_l0[:16].any()  # i, f, g, o
    assert not c.bias_hh_l0.requires_grad and not c.bias_hh_l0.any()  # Haiku's one bias
    i, f, g, o = (c.weight_ih_l0 @ x[0, 0] + c.bias_ih_l0).chunk(4)  # h_0 = c_0 = 0
    first = torch.sigmoid(o) * torch.tanh(torch.sigmoid(i) * torch.tanh(g))
    assert torch.allclose(lstm.run(x, None)[0, 0], first, atol=1e-6)


def test_weights_start_as_haiku_s_truncated_normal_with_zero_biases():
    torch.manual_seed(3)
    model = StackRNN(model_config(64), 9)
    w, fan_in = model.recur.weight.detach(), 64
    std = 1 / math.sqrt(fan_in)
    assert float(w.abs().max()) <= 2 * std and abs(float(w.std()) / std - 0.88) < 0.05  # a 2-sigma truncation
    assert not model.recur.bias.any() and not model.head.bias.any()


# --- the protocol ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", RECURRENT)
def test_the_model_reads_the_authors_tape_and_never_an_answer_token(name):
    task = get_task("reverse_string")
    method = get_method(name)
    torch.manual_seed(4)
    model = method.build_model(new_run_config(None, ["model.d_model=16"]), task)
    batch = task.sample(6, torch.tensor([1, 4, 3, 6, 2, 5]), torch.Generator().manual_seed(0))
    tape = method.model_batch(batch).inputs
    q = batch.question_len
    for b in range(len(batch)):  # the n inputs, then one BLANK slot per scored position ('=' included)
        assert torch.equal(tape[b, :q[b] - 1], batch.inputs[b, :q[b] - 1])
        assert (tape[b, q[b] - 1:int(batch.widths[b])] == BLANK).all()
    scrambled = batch.inputs.clone()
    after = torch.arange(scrambled.shape[1])[None, :] >= q[:, None] - 1
    scrambled[after & (scrambled > BLANK)] = task.token_id("1")
    with torch.no_grad():
        logits = method.logits(model, batch)
        assert torch.equal(logits, method.logits(model, type(batch)(**{**vars(batch), "inputs": scrambled})))
        flipped = batch.inputs.clone()
        flipped[:, 0] = torch.where(flipped[:, 0] == task.token_id("0"), task.token_id("1"), task.token_id("0"))
        assert not torch.allclose(logits, method.logits(model, type(batch)(**{**vars(batch), "inputs": flipped})))


@pytest.mark.parametrize("sets, key", [(["model.position=rope"], "model.position"),
                                       (["data.position_transform=randomized"], "data.position_transform"),
                                       (["task.name=flipflop"], "flipflop")])
def test_a_recurrent_method_refuses_positions_and_tasks_without_an_answer_region(sets, key):
    with pytest.raises(ConfigError, match=key):
        new_run(None, ["method=stack-rnn", "task.name=parity_check", *sets])


def test_a_recurrent_method_runs_on_a_non_chomsky_task_and_its_checkpoint_loads(tmp_path):
    from lengthgen.evaluation.evaluate import load_run
    from lengthgen.training.trainer import train
    cfg = new_run_config(None, ["method=lstm", "task.name=addition", "task.train_max=4", "model.d_model=16",
                               "train.steps=3", "train.batch_size=4", "train.checkpoint_interval=3",
                               "train.device=cpu"])
    train(cfg, tmp_path / "run", progress=False)
    _, task, method, model, _ = load_run(tmp_path / "run", torch.device("cpu"))
    batch = task.sample(3, 4, torch.Generator().manual_seed(0))
    assert method.predict(model, batch).shape == batch.inputs.shape
    assert not model.core.bias_hh_l0.any()  # the frozen bias stayed zero through training


def test_compiling_a_recurrent_model_is_declined_with_a_reason():
    from lengthgen.accel import compiling
    model = RNN(model_config(), 5)
    assert "no transformer blocks" in compiling.compilable(model)
    assert not compiling.compile_blocks(model, torch.device("cpu"))
