"""Several seeds of one configuration trained as one model (`reproduce --stack-seeds`;
lengthgen.training.stacked_seeds drives the runs): every weight stacked along a new first axis,
a seed a row, and the step's loss each seed's own loss computed side by side under
torch.func.vmap, so that each kernel does the work of S runs.

Why: a looped step at paper scale is thousands of kernels each far too small to fill a GPU (a
captured Parity step: 1,514 kernels of about 8 us, docs/benchmarks.md, "One GPU"). Stacked, a
matmul or an attention call of S seeds is one kernel of S times the work at a fraction of S times
the cost. On a CPU, which computes every row anyway, it does not pay.

Same numbers: a seed's loss, gradients, clipping (by its own gradient norm) and AdamW update are
its own run's to float rounding (tests/accel/test_stacked.py): the gradient of a sum of
independent losses is each loss's own, and AdamW is elementwise. Each seed keeps its own Trainer:
its data stream, run folder, log, tests during training and checkpoints; its model's parameters
and optimizer state are views of its row of the stack, so they always hold what it trained.
The seeds' batches are padded to the widest of the step and looped methods run the most
iterations any seed needs (Method.fixed_shape_loss, as a captured step): only methods whose
steps can be recorded stack, and on CUDA with train.capture the stacked step is recorded too
(with train.compile, its losses compiled whole from where the curriculum ends, as one run's:
2,759 kernels -> 515 for three Parity paper seeds, counted on CPU).
"""
from __future__ import annotations

import warnings
from dataclasses import fields

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from lengthgen.accel import heap
from lengthgen.accel.backends import stacked_seeds
from lengthgen.accel.captured import CapturedSteps, padded, replayed_or_none, shape_of
from lengthgen.accel.compiling import compiled_whole
from lengthgen.model.scheme_base import ids_checked_elsewhere
from lengthgen.tasks import Batch


class Stack(nn.Module):
    """The models' parameters stacked, parameter i of shape (S, *shape_i); afterwards every model's
    parameter is a view of its row (trained through the stack, read as before)."""

    def __init__(self, models: list[nn.Module]):
        super().__init__()
        named = [list(m.named_parameters()) for m in models]
        self.names = [f"model.{name}" for name, _ in named[0]]
        self.weights = nn.ParameterList(
            nn.Parameter(torch.stack([params[i][1].detach() for params in named]), requires_grad=p.requires_grad)
            for i, (_, p) in enumerate(named[0]))
        for row, params in enumerate(named):
            for (_, p), stacked in zip(params, self.weights):
                p.data = stacked.data[row]


class SeedLoss(nn.Module):
    """One seed's fixed-shape loss as a module call, which functional_call can give other weights."""

    def __init__(self, method, model: nn.Module):
        super().__init__()
        self.method, self.model, self.iterations = method, model, 0

    def forward(self, batch_fields: dict) -> Tensor:
        return self.method.fixed_shape_loss(self.model, Batch(**batch_fields), self.iterations)


def stacked_batch(batches: list[Batch], width: int) -> Batch:
    """The seeds' batches padded to `width` columns, each field stacked: (S, B, ...)."""
    grown = [padded(b, width) for b in batches]
    return Batch(**{f.name: torch.stack([getattr(b, f.name) for b in grown])
                    for f in fields(Batch) if getattr(batches[0], f.name) is not None})


def stacked_optimizer(stack: Stack, optimizers: list[torch.optim.Optimizer], models: list[nn.Module]):
    """One AdamW over the stack with the seeds' groups and settings, its state the seeds' states
    stacked (zeros at step 0); each seed's optimizer then holds views of its rows."""
    weight_of = {id(p): w for p, w in zip(models[0].parameters(), stack.weights)}
    groups = [{**{k: v for k, v in group.items() if k != "params"},
               "params": [weight_of[id(p)] for p in group["params"]]} for group in optimizers[0].param_groups]
    stacked = type(optimizers[0])(groups)
    seeds = [list(m.parameters()) for m in models]
    for i, weight in enumerate(stack.weights):
        if not weight.requires_grad:
            continue
        states = [opt.state.get(params[i], {}) for opt, params in zip(optimizers, seeds)]
        if not states[0]:
            stacked.state[weight] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(weight),
                                     "exp_avg_sq": torch.zeros_like(weight)}
            continue
        stacked.state[weight] = {name: torch.stack([s[name] for s in states]) if value.dim() else value.clone()
                                 for name, value in states[0].items()}
    return stacked


def share_state(stacked: torch.optim.Optimizer, stack: Stack, optimizers: list, models: list) -> None:
    """Each seed's optimizer state as views of its rows of the stacked state (one step count)."""
    for row, (opt, model) in enumerate(zip(optimizers, models)):
        for p, weight in zip(model.parameters(), stack.weights):
            if weight in stacked.state:
                opt.state[p] = {name: value[row] if value.dim() else value
                                for name, value in stacked.state[weight].items()}


@torch.no_grad()
def clip_rows(weights: list[Tensor], max_norm: float) -> None:
    """clip_grad_norm_ for each seed on its own: its gradients scaled by max_norm / (its norm + 1e-6), at most 1."""
    grads = [w.grad for w in weights if w.grad is not None]
    norms = torch.stack([g.reshape(len(g), -1).norm(dim=1) for g in grads]).norm(dim=0)  # (S,)
    scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(scale.view(-1, *(1,) * (g.dim() - 1)))


class StackedSteps:
    """The seeds' training steps as one: `__call__(batches, lr)` takes each seed's batch, does the
    whole step (gradients, each seed's clipping, the update) and returns the (S,) losses."""

    def __init__(self, method, states: list, grad_clip: float, precision: str, device: torch.device,
                 capture: bool, compile_after: int | None = None):
        models, optimizers = [s.model for s in states], [s.optimizer for s in states]
        self.method, self.grad_clip, self.precision, self.device = method, grad_clip, precision, device
        heap.keep(device)  # as a run's own steps keep it (FastPaths.start)
        self.stack = Stack(models)
        self.optimizer = stacked_optimizer(self.stack, optimizers, models)
        self.seed_optimizers = optimizers
        self.loss_module = SeedLoss(method, models[0])
        self.params = [w for w in self.stack.weights if w.requires_grad]
        self.captured = StackedCaptured(self, compile_after) if capture else None  # step counts to the device
        share_state(self.optimizer, self.stack, optimizers, models)

    def losses(self, batch: Batch, iterations: int) -> Tensor:
        """(S,) each seed's fixed-shape loss, under vmap over the stack's rows and the batch's."""
        self.loss_module.iterations = iterations

        def one(weights, batch_fields):
            return functional_call(self.loss_module, dict(zip(self.stack.names, weights)), (batch_fields,))

        batch_fields = {f.name: getattr(batch, f.name) for f in fields(Batch) if getattr(batch, f.name) is not None}
        # the batched IDs cannot be read on the host; they are training batches', whose range
        # assembly checked (lengthgen.assembly's position checks)
        with warnings.catch_warnings(), stacked_seeds(), ids_checked_elsewhere():
            warnings.filterwarnings("ignore", message="There is a performance drop")  # CPU attention: vmap loops
            return vmap(one, randomness="different")(tuple(self.stack.weights), batch_fields)

    def body(self, batch: Batch, iterations: int, loss_of=None) -> Tensor:
        """The whole step on a stacked batch: what a recorded graph holds (`loss_of`: `losses` compiled)."""
        for w in self.params:
            if w.grad is not None:
                w.grad.zero_()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16",
                            cache_enabled=False):
            losses = (loss_of or self.losses)(batch, iterations)
        losses.sum().backward()
        if self.grad_clip > 0:
            clip_rows(self.params, self.grad_clip)
        self.optimizer.step()
        return losses.detach()

    def __call__(self, batches: list[Batch], lr: float) -> Tensor:
        for opt in self.seed_optimizers:  # what each seed's checkpoint says, as an unstacked run's
            for group in opt.param_groups:
                group["lr"] = lr
        if self.captured is not None:
            loss = replayed_or_none(self.captured.stacked, batches, lr, what="the stacked step")
            if loss is not None:
                return loss
            self.captured = None
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        width, iterations, _ = step_shape(self.method, batches)
        return self.body(stacked_batch(batches, width).to(self.device), iterations)


def step_shape(method, batches: list[Batch]) -> tuple[int, int, tuple]:
    """(width, loop count, layout) that every seed's batch fits (one config: one layout)."""
    shapes = [shape_of(method, b) for b in batches]
    return max(s[0] for s in shapes), max(s[1] for s in shapes), shapes[0][2]


class StackedCaptured(CapturedSteps):
    """The stacked step recorded as CUDA graphs, one per shape bucket (lengthgen.accel.captured)."""

    def __init__(self, steps: StackedSteps, compile_after: int | None = None):
        super().__init__(steps.method, steps.stack, steps.optimizer, steps.grad_clip, steps.precision, steps.device)
        self.steps = steps
        if compile_after is not None:  # the seeds' losses under vmap compiled whole, as one model's
            self.whole = compiled_whole(steps.loss_module.model, steps.losses)
            self.compile_after, self.compiled = compile_after, self.whole is not None

    def step_body(self, batch: Batch, iterations: int, compiled: bool = False) -> Tensor:
        return self.steps.body(batch, iterations, self.whole if compiled else None)

    def stacked(self, batches: list[Batch], lr: float) -> Tensor:
        key, new, compile_now = self.choose(*step_shape(self.method, batches))
        if new:
            self.graphs[key] = self.recorded(stacked_batch(batches, key[0]).to(self.device), key[1], compile_now)
        self.lr.fill_(lr)
        return self.graphs[key].replay(stacked_batch(batches, key[0]))
