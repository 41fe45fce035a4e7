"""Tiny runs trained in a few steps, exported, and loaded back with the real `transformers`: the
helpers the export tests share."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from lengthgen.assembly.runs import new_run
from lengthgen.evaluation.evaluate import load_assembled
from lengthgen.export.export import export_run
from lengthgen.training.trainer import train

BASE = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.name=copy", "task.train_max=4",
        "train.batch_size=8", "train.log_interval=5", "train.device=cpu", "train.steps=3", "optim.lr=1e-2",
        "train.checkpoint_interval=100", "eval.lengths=2,4", "eval.samples=8", "model.max_positions=64"]
LOOPED = ["method=looped", "model.init=torch"]
PPC = ["method=ppc", "task.name=decimal_addition", "task.options.coupled=true", "task.train_min=1",
       "model.position=learned", "model.max_positions=16", "data.position_transform=random_offset",
       "data.position_transform_options={max_position=15, keep_zero=true}"]


def trained(root: Path, name: str, *overrides: str) -> Path:
    """A finished tiny run in root/name (copy, 3 steps, unless `overrides` say otherwise)."""
    folder = root / name
    train(new_run(None, BASE + list(overrides)), folder, progress=False)
    return folder


def exported(root: Path, name: str, *overrides: str) -> tuple[Path, Path]:
    run = trained(root, name, *overrides)
    out = root / f"{name}-hf"
    export_run(run, out)
    return run, out


def hf_model(folder: Path):
    """The export loaded as a user would, with transformers on the CPU, in float32."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=True).eval()


def pair(root: Path, name: str, *overrides: str):
    """(lengthgen's run, its model, the exported model loaded in transformers)."""
    run_folder, out = exported(root, name, *overrides)
    run, model, _ = load_assembled(run_folder, torch.device("cpu"))
    return run, model, hf_model(out)


def sample_batch(run, length: int = 4, rows: int = 6):
    return run.task.sample(rows, length, torch.Generator().manual_seed(7))
