"""The recurrent and memory-augmented baselines of Delétang et al. (ICLR 2023, "Neural Networks and the
Chomsky Hierarchy"), as their released code (Haiku) defines them: an RNN, an LSTM, a Stack-RNN and a
Tape-RNN. docs/chomsky.md ("Recurrent and memory-augmented baselines") has the equations.

Every model reads a tape of token ids (B, T) left to right, one token per step, and returns logits
at every step (B, T, V) through the authors' read-out Linear(ReLU(h_t)). The hidden width is
model.d_model; the other sizes are the authors' defaults below (lengthgen has no keys for them).

Haiku's defaults are kept where they shape learning: every linear layer starts from a normal
truncated at two standard deviations, std 1/sqrt(fan_in), biases zero (hk.Linear); the vanilla RNN
is ReLU(W_i x + b_i + W_h h + b_h) (hk.VanillaRNN: ReLU, not tanh); the LSTM adds 1 to the forget
gate (hk.LSTM), here the initial value of a trainable bias (the same function and, under Adam
without decay on biases, the same updates).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lengthgen.config.schema import ModelConfig

CELL_SIZE = 8  # width of a stack or tape cell (the authors' stack_cell_size / memory_cell_size)
N_STACKS = 1  # independent stacks of the Stack-RNN (StackRNNCore's default)
N_TAPES = 1  # tapes of the Tape-RNN (TapeRNNCore's default; the paper also sweeps 4)
TAPE_MLP = (64, 64)  # hidden widths of the MLP that computes the Tape-RNN's write value
STACK_ACTIONS = 3  # push, pop, no-op: the order of the authors' softmax
TAPE_ACTIONS = 5  # write and: stay, left, right, jump left by the input length, jump right by it


def haiku_init(layer: nn.Linear) -> nn.Linear:
    """hk.Linear's initial values: weight ~ N(0, 1/fan_in) truncated at +-2 std, bias 0."""
    std = 1 / math.sqrt(layer.in_features)
    nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


def linear(d_in: int, d_out: int, bias: bool = True) -> nn.Linear:
    return haiku_init(nn.Linear(d_in, d_out, bias=bias))


class Recurrent(nn.Module):
    """A model that reads its tape in order: one-hot tokens in, `run` over the steps, then the
    authors' read-out Linear(ReLU(h_t)) at every step. `input_lengths` (B,) is the number of input
    tokens of each row, which only the Tape-RNN's jumps read."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg, self.vocab_size, self.hidden = cfg, vocab_size, cfg.d_model
        self.head = linear(self.hidden, vocab_size)

    def run(self, x: Tensor, input_lengths: Tensor) -> Tensor:  # (B, T, V) one-hot -> (B, T, H)
        raise NotImplementedError

    def forward(self, tokens: Tensor, input_lengths: Tensor | None = None) -> Tensor:  # (B, T) -> (B, T, V)
        if input_lengths is None:
            input_lengths = torch.full(tokens.shape[:1], tokens.shape[1], device=tokens.device)
        x = F.one_hot(tokens, self.vocab_size).to(self.head.weight.dtype)
        return self.head(F.relu(self.run(x, input_lengths)))


class RNN(Recurrent):
    """hk.VanillaRNN: h_t = ReLU(W_i x_t + b_i + W_h h_{t-1} + b_h), h_0 = 0 (torch's fused loop)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__(cfg, vocab_size)
        self.core = nn.RNN(vocab_size, self.hidden, nonlinearity="relu", batch_first=True)
        for name, p in self.core.named_parameters():  # W_i, W_h as two hk.Linear: fan-in V and H
            haiku_init_(p, vocab_size if name.endswith("ih_l0") else self.hidden)

    def run(self, x, input_lengths):
        return self.core(x)[0]


class LSTM(Recurrent):
    """hk.LSTM: [i, g, f, o] = W [x_t; h_{t-1}] + b (one linear layer, one bias),
    c_t = sigmoid(f + 1) c_{t-1} + sigmoid(i) tanh(g), h_t = sigmoid(o) tanh(c_t)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__(cfg, vocab_size)
        self.core = nn.LSTM(vocab_size, self.hidden, batch_first=True)
        fan_in = vocab_size + self.hidden  # Haiku's one linear layer reads x and h together
        for p in self.core.parameters():
            haiku_init_(p, fan_in)
        # one bias, as Haiku's: torch's second one stays zero and untrained
        self.core.bias_hh_l0.requires_grad_(False)
        with torch.no_grad():  # torch's gate order is i, f, g, o: the forget gate's +1
            self.core.bias_ih_l0[self.hidden:2 * self.hidden] = 1.0

    def run(self, x, input_lengths):
        return self.core(x)[0]


def haiku_init_(p: Tensor, fan_in: int) -> None:
    """A weight (2-D) as hk.Linear of fan-in `fan_in` draws it, a bias (1-D) zero."""
    if p.dim() == 1:
        nn.init.zeros_(p)
        return
    std = 1 / math.sqrt(fan_in)
    nn.init.trunc_normal_(p, std=std, a=-2 * std, b=2 * std)


class MemoryRNN(Recurrent):
    """A vanilla-RNN controller that also reads memory (stacks or tapes, cells of CELL_SIZE) at each
    step: h_t = ReLU(W_i [x_t; read_{t-1}] + b_i + W_h h_{t-1} + b_h), then `update` the memory
    from h_t. The memory has as many cells as the tape has steps: enough that a stack never
    overflows and a head never wraps into its own writes on the way out (the paper enlarges its
    memory at test; the authors' code keeps 30 cells)."""

    n_memories = 1

    def __init__(self, cfg: ModelConfig, vocab_size: int, n_memories: int | None = None):
        super().__init__(cfg, vocab_size)
        self.n_memories = n_memories or self.n_memories
        self.read_in = linear(vocab_size + self.n_memories * CELL_SIZE, self.hidden)  # one hk.Linear on [x; read]
        self.recur = linear(self.hidden, self.hidden)

    def update(self, memory: Tensor, h: Tensor, jumps: Tensor) -> Tensor:
        raise NotImplementedError

    def run(self, x, input_lengths):
        B, T, V = x.shape
        w = self.read_in.weight
        xs = F.linear(x, w[:, :V], self.read_in.bias)  # (B, T, H): the input's part, for every step at once
        memory = x.new_zeros(B, self.n_memories, T, CELL_SIZE)  # (B, N, S, d), cell 0 is read
        h = x.new_zeros(B, self.hidden)
        jumps = jump_indices(input_lengths, memory.shape[2])
        out = []
        for t in range(T):
            read = memory[:, :, 0].flatten(1)  # (B, N d)
            h = F.relu(xs[:, t] + F.linear(read, w[:, V:]) + self.recur(h))
            memory = self.update(memory, h, jumps)
            out.append(h)
        return torch.stack(out, 1)


class StackRNN(MemoryRNN):
    """StackRNNCore: push value v_t = W_v h_t + b_v, (push, pop, no-op) = softmax(W_a h_t + b_a),
    and the stack (top = cell 0) updated by `stack_update`."""

    n_memories = N_STACKS

    def __init__(self, cfg: ModelConfig, vocab_size: int, n_memories: int | None = None):
        super().__init__(cfg, vocab_size, n_memories)
        self.push = linear(self.hidden, self.n_memories * CELL_SIZE)
        self.actions = linear(self.hidden, self.n_memories * STACK_ACTIONS)

    def update(self, memory, h, jumps):
        B, N = memory.shape[:2]
        actions = self.actions(h).view(B, N, STACK_ACTIONS).softmax(-1)
        return stack_update(memory, actions, self.push(h).view(B, N, CELL_SIZE))


class TapeRNN(MemoryRNN):
    """TapeInputLengthJumpCore: write value w_t = MLP(h_t) (ReLU between layers), actions
    softmax(W_a h_t + b_a) over the five moves, one softmax per tape; `tape_update` writes w_t
    to the head's cell and moves the ring under the head."""

    n_memories = N_TAPES

    def __init__(self, cfg: ModelConfig, vocab_size: int, n_memories: int | None = None):
        super().__init__(cfg, vocab_size, n_memories)
        widths = (self.hidden, *TAPE_MLP, self.n_memories * CELL_SIZE)
        layers = [linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
        self.write = nn.Sequential(*[m for layer in layers[:-1] for m in (layer, nn.ReLU())], layers[-1])
        self.actions = linear(self.hidden, self.n_memories * TAPE_ACTIONS)

    def update(self, memory, h, jumps):
        B, N = memory.shape[:2]
        actions = self.actions(h).view(B, N, TAPE_ACTIONS).softmax(-1)
        return tape_update(memory, actions, self.write(h).view(B, N, CELL_SIZE), jumps)


def stack_update(stack: Tensor, actions: Tensor, push: Tensor) -> Tensor:
    """The authors' stack step (_update_stack), for stacks (B, N, S, d) with the top at cell 0,
    actions (B, N, 3) = (push, pop, no-op) and push values (B, N, d):
        s'[0] = push v + pop s[1] + no-op s[0]
        s'[i] = push s[i-1] + pop s[i+1] + no-op s[i]   (i >= 1, s[S] = 0: the bottom falls off)."""
    a_push, a_pop, a_noop = (a[..., None, None] for a in actions.unbind(-1))  # each (B, N, 1, 1)
    pushed = torch.cat([push[:, :, None], stack[:, :, :-1]], 2)
    popped = torch.cat([stack[:, :, 1:], torch.zeros_like(stack[:, :, :1])], 2)
    return a_push * pushed + a_pop * popped + a_noop * stack


def jump_indices(input_lengths: Tensor, size: int) -> Tensor:
    """(2, B, S) the cells that the jumps by +l and -l bring under cell m of a ring of `size`
    cells: (m + l) mod S and (m - l) mod S, l = input_lengths[b]."""
    m = torch.arange(size, device=input_lengths.device)[None, :]
    step = input_lengths.long()[:, None]
    return torch.stack([(m + step) % size, (m - step) % size])


def tape_update(tape: Tensor, actions: Tensor, write: Tensor, jumps: Tensor) -> Tensor:
    """The authors' tape step (TapeRNNCore._update_memory with TapeInputLengthJumpCore's moves),
    for tapes (B, N, S, d) whose head is always cell 0 of a ring, actions (B, N, 5), write values
    (B, N, d) and `jump_indices`: every action first writes, M' = M with M'[0] = w, then
        M_t[m] = sum_a p_a M'[(m + delta_a) mod S],  delta = (0, +1, -1, +l, -l)
    (stay, left, right, jump left, jump right; "left" brings cell 1 under the head)."""
    written = torch.cat([write[:, :, None], tape[:, :, 1:]], 2)
    B, N, S, d = written.shape
    moved = [written, written.roll(-1, 2), written.roll(1, 2)]  # roll(-1): new[m] = old[m + 1]
    for index in jumps:  # (B, S), one row per sample: the input length varies within a batch
        moved.append(written.gather(2, index[:, None, :, None].expand(B, N, S, d)))
    p = actions.permute(2, 0, 1)[..., None, None]  # (5, B, N, 1, 1)
    return (p * torch.stack(moved)).sum(0)
