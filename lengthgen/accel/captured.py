"""The whole training step as CUDA graphs (train.capture, on CUDA): forward over every loop
iteration, backward, gradient clipping and the AdamW update, recorded once per shape and replayed.

Why: a looped step launches thousands of small kernels (a Parity paper step: 2,705), and on a
GPU the launches, not the arithmetic, set its time; the GPU computed for 15-20 % of an eager step
(docs/cluster.md). A replayed graph launches them all at once.

Shapes. A graph holds fixed shapes, so each batch is padded on the host to a shape bucket: its
width rounded up to WIDTH_MULTIPLE columns (PAD inputs, IGNORE targets: attention is causal, so
columns to the right change nothing before them) and, for a looped method, its loop count, the
batch's largest T(n) (the authors' "max" scheme: every sample runs that many iterations and is
read out at its own T_i, lengthgen.methods.looped.block). A batch replays the smallest recorded
graph it fits, so a curriculum records about one graph per length and then reuses the longest.
Every graph shares one memory pool: they never run at once.

Same numbers: the padded loss is the packed one to float rounding (tests/training/
test_captured.py); an optimizer step replayed from a graph is the eager one with lr as a tensor
(AdamW with capturable=True). Before recording a shape the step runs once eagerly on a side stream
(cuBLAS and the optimizer's state need it), and the weights and optimizer state are put back, so
the recorded run follows the eager one. Dropout draws differ (the graph's philox offsets).

With train.compile the recorded loss is compiled whole (lengthgen.accel.compiling.compile_step),
from where the curriculum ends: a bucket's first step then compiles it, and inductor's kernels are
what its CUDA graph records.

What cannot be recorded runs eagerly, with a one-line note: a method whose loss reads shapes
on the host (`Method.capturable`: ntp-pause, tape-rnn), data-parallel runs, and any step whose
recording fails. The trained stops' losses on every iteration have fixed-shape forms of their
own (lengthgen.methods.looped.fixed_steps).
"""
from __future__ import annotations

import sys
from dataclasses import fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from lengthgen.errors import first_line
from lengthgen.accel.compiling import compile_failed, compiled_whole
from lengthgen.runtime.resources import is_out_of_memory
from lengthgen.tasks import IGNORE, PAD, Batch

WIDTH_MULTIPLE = 8  # columns a bucket's width is rounded up to: fewer graphs, little padding


def padded(batch: Batch, width: int) -> Batch:
    """`batch` right-padded to `width` columns: PAD inputs, IGNORE targets and target IDs, 0 IDs."""
    fill = {"inputs": PAD, "targets": IGNORE, "target_ids": IGNORE, "position_ids": 0}
    grown = {}
    for name, value in fill.items():
        tensor = getattr(batch, name)
        if tensor is not None and tensor.shape[1] < width:
            grown[name] = F.pad(tensor, (0, width - tensor.shape[1]), value=value)
    return replace(batch, **grown)


def shape_of(method, batch: Batch) -> tuple[int, int, tuple]:
    """(width, loop count, the rest of its layout) a batch needs, read on the host: the batch is
    still on the CPU. Batches of one layout share graphs (rows and which fields it holds)."""
    layout = tuple((f.name, tuple(t.shape[:1])) for f in fields(Batch) if (t := getattr(batch, f.name)) is not None)
    return batch.inputs.shape[1], method.iterations(batch), layout


class Recorded:
    """One shape's graph: the static batch it reads and the loss it writes; `compiled`: its loss
    was compiled whole."""

    def __init__(self, graph: torch.cuda.CUDAGraph, batch: Batch, loss: Tensor, compiled: bool = False):
        self.graph, self.batch, self.loss, self.compiled = graph, batch, loss, compiled

    def replay(self, batch: Batch) -> Tensor:
        for field in fields(Batch):
            source = getattr(batch, field.name)
            if source is not None:
                getattr(self.batch, field.name).copy_(source, non_blocking=True)
        self.graph.replay()
        return self.loss.clone()  # the next replay overwrites the static loss


class CapturedSteps:
    """Training steps replayed from CUDA graphs, one graph per shape bucket. `__call__(batch, lr)`
    does the whole step (gradients, clipping, the optimizer) and returns the loss on the device.
    `compile_after` (train.compile): from that many calls on, a new bucket's loss is compiled
    whole and only such graphs are replayed; None: never. A bucket costs a compilation (tens of
    seconds at paper scale), so the trainer starts compiling where the curriculum ends: the
    shorter lengths before it each serve a few hundred steps, the last one the rest of the run."""

    def __init__(self, method, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float,
                 precision: str, device: torch.device, compile_after: int | None = None):
        self.method, self.model, self.optimizer = method, model, optimizer
        self.whole = compiled_whole(model, method.fixed_shape_loss) if compile_after is not None else None
        self.compile_after, self.calls, self.compiled = compile_after, 0, self.whole is not None
        self.grad_clip, self.precision, self.device = grad_clip, precision, device
        self.graphs: dict[tuple[int, int, tuple], Recorded] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.lr = torch.zeros((), device=device)  # read by every replay: the schedule fills it
        self.params = [p for p in model.parameters() if p.requires_grad]
        make_capturable(optimizer, self.lr, device)

    def __call__(self, batch: Batch, lr: float) -> Tensor:
        key, new, compile_now = self.choose(*shape_of(self.method, batch))
        if new:
            self.graphs[key] = self.recorded(padded(batch, key[0]).to(self.device), key[1], compile_now)
        self.lr.fill_(lr)
        return self.graphs[key].replay(padded(batch, key[0]))

    def recorded(self, batch: Batch, iterations: int, compiled: bool) -> Recorded:
        """`record`; where compiling fails, a note, and this graph and every later one uncompiled."""
        try:
            return self.record(batch, iterations, compiled)
        except Exception as err:
            if not (compiled and compile_failed(err)):
                raise
            first = first_line(err)
            print(f"lengthgen: note: train.compile: compiling the recorded step failed ({type(err).__name__}: "
                  f"{first}); recording it uncompiled", file=sys.stderr)
            self.compiled = False
            return self.record(batch, iterations, False)

    def choose(self, width: int, iterations: int, layout: tuple) -> tuple[tuple, bool, bool]:
        """(the graph key a batch of this shape replays, whether it is new, whether a new one is
        compiled): once compiling has started, only compiled graphs are replayed."""
        compile_now = self.compiled and self.calls >= self.compile_after
        self.calls += 1
        keys = [key for key, graph in self.graphs.items() if graph.compiled or not compile_now]
        return (*bucket(keys, width, iterations, layout), compile_now)

    def step_body(self, batch: Batch, iterations: int, compiled: bool = False) -> Tensor:
        """What one graph holds: zeroed gradients, the loss and its gradients, clipping, the update."""
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()
        # autocast's weight cache would hold casts made at recording time: off inside a graph
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16",
                            cache_enabled=False):
            loss = (self.whole if compiled else self.method.fixed_shape_loss)(self.model, batch, iterations)
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        self.optimizer.step()
        return loss.detach()

    def record(self, batch: Batch, iterations: int, compiled: bool = False) -> Recorded:
        """Run the step once on a side stream (allocating gradients, the optimizer's state and
        cuBLAS's workspace; compiling, for a compiled one), put the weights and state back, then
        record the step as a graph."""
        kept = snapshot(self.model, self.optimizer)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(side):
                self.step_body(batch, iterations, compiled)
        finally:
            torch.cuda.current_stream(self.device).wait_stream(side)
            restore(self.model, self.optimizer, kept)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            loss = self.step_body(batch, iterations, compiled)
        return Recorded(graph, batch, loss, compiled)

    def count(self) -> int:
        return len(self.graphs)


def make_capturable(optimizer: torch.optim.Optimizer, lr: Tensor, device: torch.device) -> None:
    """AdamW as a graph can replay it: its step counts on the device and lr a tensor."""
    for group in optimizer.param_groups:
        group["capturable"], group["lr"] = True, lr
    for state in optimizer.state.values():
        if "step" in state:
            state["step"] = state["step"].to(device=device, dtype=torch.float32)


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[list[Tensor], dict]:
    weights = [p.detach().clone() for p in model.parameters()]
    state = {p: {k: v.clone() if isinstance(v, Tensor) else v for k, v in s.items()}
             for p, s in optimizer.state.items()}
    return weights, state


@torch.no_grad()
def restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer, kept: tuple[list[Tensor], dict]) -> None:
    """Weights and optimizer state back to `kept`, in place (a graph reads these addresses); state
    the optimizer made since then is zeroed, as a fresh AdamW's is."""
    weights, state = kept
    for p, w in zip(model.parameters(), weights):
        p.copy_(w)
    for p, slots in optimizer.state.items():
        for name, value in slots.items():
            if isinstance(value, Tensor):
                value.copy_(state[p][name]) if p in state else value.zero_()


def bucket(keys, width: int, iterations: int, layout: tuple) -> tuple[tuple[int, int, tuple], bool]:
    """(the graph key a batch of this shape replays, whether it is new): the cheapest recorded graph
    at least as wide, looping at least as often, of the same layout; else a new one, its width
    rounded up to WIDTH_MULTIPLE."""
    fits = [key for key in keys if key[0] >= width and key[1] >= iterations and key[2] == layout]
    if fits:
        return min(fits, key=lambda k: k[0] * max(k[1], 1)), False
    return (-(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE, iterations, layout), True


def capture_refusal(method, ranks_world: int, shards: int) -> str | None:
    """Why this run's steps cannot be recorded, or None (CPU runs are never recorded: no note)."""
    if not method.capturable:
        return f"method {method.name} reads its shapes on the host during its loss"
    if ranks_world > 1 or shards > 1:
        return "data-parallel steps (several processes or data.shards > 1) run eagerly"
    return None


def replayed_or_none(replay, *args, what: str = "the step") -> Tensor | None:
    """`replay(*args)`, or None with a note where recording fails: the caller then runs its steps
    eagerly. Running out of memory is raised, as an eager step's would be."""
    try:
        return replay(*args)
    except Exception as err:
        if is_out_of_memory(err):
            raise
        note(f"recording {what} failed ({type(err).__name__}: {first_line(err)})")
        return None


def note(reason: str) -> None:
    print(f"lengthgen: note: train.capture is off for this run: {reason}; steps run eagerly", file=sys.stderr)
