"""Checkpoints: safetensors weights + JSON sidecar, optimizer state beside.

Layout inside a run folder:

    checkpoints/step_00000500/model.safetensors   weights of the (unwrapped) model
    checkpoints/step_00000500/ema.safetensors     EMA weights, when train.ema > 0
    checkpoints/step_00000500/optimizer.pt        optimizer state (tensors and numbers only)
    checkpoints/step_00000500/state.json          config, step, RNG states
    checkpoints/latest                            name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder and renamed into place,
then `latest` is replaced atomically, so a run killed at any moment leaves the
previous checkpoint intact. Loading never unpickles code: safetensors holds
only tensors and the optimizer file is read with `weights_only=True`.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from .errors import UserError

LATEST = "latest"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def encode_state(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def decode_state(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def save(folder: Path, step: int, model, optimizer, ema, state: dict, keep: int = 1) -> Path:
    """Write checkpoint `step` under folder/checkpoints and point `latest` at it."""
    root = folder / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:08d}"
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    if ema is not None:
        save_model(ema, str(tmp / "ema.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, indent=1))
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_atomic(root / LATEST, name)
    old = sorted(p for p in root.glob("step_*") if p.name != name)
    for stale in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def latest(folder: Path) -> Path | None:
    pointer = folder / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    path = folder / "checkpoints" / pointer.read_text().strip()
    if not (path / "state.json").is_file():
        raise UserError(f"checkpoint {path} named by {pointer} is missing or incomplete")
    return path


def read_state(path: Path) -> dict:
    try:
        return json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"checkpoint {path}/state.json is unreadable: {err}") from None


def load_weights(module, file: Path) -> None:
    try:
        missing, unexpected = load_model(module, str(file), strict=False)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise UserError(f"checkpoint {file} is corrupt or does not match the model: {str(err).splitlines()[0]}") from None
    if missing or unexpected:
        raise UserError(f"checkpoint {file} does not match the model (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def load_optimizer(optimizer, file: Path) -> None:
    try:
        optimizer.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))
    except Exception as err:  # any failure here means the file is not a usable optimizer state
        raise UserError(f"optimizer state {file} is corrupt: {str(err).splitlines()[0]}") from None
