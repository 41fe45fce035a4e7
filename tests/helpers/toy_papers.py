"""The toy presets and papers the grid, reproduction, Ray and fault tests share: one-layer models
of width 16 on tasks of length 4, small enough that a whole grid trains in seconds."""
from __future__ import annotations

from pathlib import Path


def toy_preset(task: str = "parity", method: str = "ntp", train_max: int = 4, steps: int = 20,
               lengths: str = "2,4", samples: int = 16, model: str = "", evaluation: str = "") -> str:
    """A preset's TOML; `model` and `evaluation` are extra lines of those sections."""
    return f"""
method = "{method}"
[task]
name = "{task}"
train_max = {train_max}
[model]
d_model = 16
n_layer = 1
n_head = 2
{model}
[train]
steps = {steps}
batch_size = 8
log_interval = 10
checkpoint_interval = 10
device = "cpu"
[eval]
lengths = "{lengths}"
samples = {samples}
{evaluation}
"""


def positions_grid(title: str, arms: str = "") -> str:
    """A grid.toml over Parity with a NoPE and a RoPE arm, and `arms` (more [arms.NAME] tables)."""
    return f"""
title = "{title}"
seeds = 1
[tasks.parity]
[arms.nope]
set = {{"model.position" = "nope"}}
[arms.rope]
set = {{"model.position" = "rope"}}
{arms}
[scales.cpu]
"""


def toy_paper(folder: Path, grid: str, presets: dict[str, str]) -> Path:
    """A paper folder: grid.toml and cpu/<task>.toml for each preset."""
    (folder / "cpu").mkdir(parents=True, exist_ok=True)
    (folder / "grid.toml").write_text(grid)
    for task, text in presets.items():
        (folder / "cpu" / f"{task}.toml").write_text(text)
    return folder
