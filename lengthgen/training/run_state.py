"""A run's state at a step: everything training changes (weights, their moving average, the
optimizer, the data stream, the step, training seconds) and nothing else, so that a checkpoint
is this state written down and `--resume` is this state read back."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

from lengthgen.config.schema import Config, OptimConfig, to_dict
from lengthgen.runtime import checkpoint


def decay_params(model: torch.nn.Module, decay_all: bool = False) -> list[dict]:
    """Weight decay on matrices only (not on biases, norms), or on every parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_all:
        return [{"params": params}]
    return [{"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


@dataclass
class RunState:
    model: torch.nn.Module
    ema: torch.nn.Module | None  # the weights' exponential moving average (optim.ema > 0)
    optimizer: torch.optim.Optimizer
    data: torch.Generator  # the training data stream (and the position IDs drawn with it)
    step: int = 0
    trained_seconds: float = 0.0  # across resumes, not counting the time the run was stopped

    @classmethod
    def start(cls, cfg: Config, method, task, device: torch.device) -> RunState:
        """Step 0: the model initialised from train.model_seed, the data stream from data.seed."""
        op = cfg.optim
        torch.manual_seed(cfg.train.model_seed)
        model = method.build_model(cfg, task).to(device)
        ema = copy.deepcopy(model).requires_grad_(False) if op.ema > 0 else None
        # torch's default (foreach): the fused AdamW is 3x faster on CPU but saves 1-2 % of a step, and
        # its rounding moved a Parity seed below the demo's target (docs/benchmarks.md, "The optimizer")
        optimizer = torch.optim.AdamW(decay_params(model, op.decay_all), lr=op.lr, betas=tuple(op.betas),
                                      weight_decay=op.weight_decay)
        return cls(model, ema, optimizer, torch.Generator().manual_seed(cfg.data.seed))

    def restore(self, folder: Path) -> None:
        """Continue from the run's latest checkpoint (its files checked against their digests)."""
        path = checkpoint.latest(folder)
        state = checkpoint.read_state(path)
        digests = state.get("sha256")
        checkpoint.load_weights(self.model, path / "model.safetensors", digests)
        if self.ema is not None:
            checkpoint.load_weights(self.ema, path / "ema.safetensors", digests)
        checkpoint.load_optimizer(self.optimizer, path / "optimizer.pt", digests)
        checkpoint.restore_rng(path, state, self.data)
        self.step = state["step"]

    def save(self, folder: Path, cfg: Config) -> None:
        """A checkpoint of this step (atomic: a failed write is never the latest)."""
        state = {"config": to_dict(cfg), "data_rng": checkpoint.encode_state(self.data.get_state()),
                 "torch_rng": checkpoint.encode_state(torch.get_rng_state()), "finished": self.step >= cfg.train.steps}
        checkpoint.save(folder, self.step, self.model, self.optimizer, self.ema, state)

    @torch.no_grad()
    def update_ema(self, op: OptimConfig) -> None:
        """After an optimizer step: the EMA starts as the weights after step ema_start, then
        follows them with decay optim.ema."""
        if self.ema is None or self.step + 1 < op.ema_start:
            return
        ema, weights = list(self.ema.parameters()), list(self.model.parameters())
        if self.step + 1 == op.ema_start:
            torch._foreach_copy_(ema, weights)
        else:
            torch._foreach_lerp_(ema, weights, 1 - op.ema)

    def tested_weights(self, ema_start: int) -> torch.nn.Module:
        """The weights evaluated: the EMA once it has started, else the model."""
        return self.ema if self.ema is not None and self.step >= ema_start else self.model
