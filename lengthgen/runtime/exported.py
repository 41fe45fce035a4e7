"""A folder written by `lengthgen export` read back as a run (docs/export.md): its config (the
run's whole config, kept in config.json), its step and its weights, so `lengthgen eval` and
`lengthgen report` take a downloaded model without its run folder. The writing side is
lengthgen.export; this reading side sits low, where evaluation can reach it."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from lengthgen.errors import UserError
from lengthgen.runtime.run_folders import EXPORT_MARK as MARK  # written last: what tells an export from a run

EXTRA = "lengthgen_extra.safetensors"  # parameters the Hugging Face model has no place for (a halting head)
PREFIX = "model."  # the wrapper holds lengthgen's model as `.model`


def is_export(folder: Path) -> bool:
    return (Path(folder) / MARK).is_file()


def verify(folder: Path, name: str) -> None:
    """A UserError unless `name` in the export `folder` is the file the export wrote, byte for byte
    (its sha256 in the mark: weights overwritten since are never evaluated silently). Exports written
    before the mark recorded digests are read unchecked, as checkpoints from before theirs."""
    folder = Path(folder)
    try:
        recorded = json.loads((folder / MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{folder / MARK} is not the mark of a lengthgen export ({type(err).__name__}); "
                        "export the run again") from None
    digests = recorded.get("sha256") if isinstance(recorded, dict) else None
    if not isinstance(digests, dict) or name not in digests:
        return
    try:
        actual = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    except OSError as err:
        raise UserError(f"{folder / name} cannot be read ({err.strerror}); export the run again") from None
    if actual != digests[name]:
        raise UserError(f"{folder / name} is not the file lengthgen export wrote (its sha256 differs from the one in "
                        f"{MARK}: changed or damaged since); export the run again")


def exported_state(folder: Path) -> dict:
    """{"config": the run's config (a dict), "step": its step}, as a checkpoint's state holds them."""
    verify(folder, "config.json")
    path = Path(folder) / "config.json"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))["lengthgen_export"]
        return {"config": record["config"], "step": int(record["step"]), "finished": True}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path} is not the config.json of a lengthgen export ({type(err).__name__}: {err})") from None


def load_exported_weights(module: torch.nn.Module, folder: Path) -> None:
    """The export's weights into a model lengthgen built from its config: model.safetensors without
    the wrapper's prefix, and the extra file where there is one. A tied read-out is not in the file
    (the model ties it itself); anything else missing or left over is a one-line error."""
    folder = Path(folder)
    for name in ("model.safetensors", EXTRA):
        verify(folder, name)
    try:
        state = {k.removeprefix(PREFIX): v for k, v in load_file(str(folder / "model.safetensors")).items()}
        if (folder / EXTRA).is_file():
            state.update(load_file(str(folder / EXTRA)))
    except (SafetensorError, OSError) as err:
        raise UserError(f"the weights of export {folder} cannot be read: {str(err).splitlines()[0]}") from None
    tied = {"lm_head.weight"} if getattr(module, "lm_head", None) is not None \
        and module.lm_head.weight is getattr(module, "wte", None).weight else set()
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as err:
        raise UserError(f"export {folder} does not match its config: {str(err).splitlines()[0]}") from None
    missing = sorted(set(missing) - tied)
    if missing or unexpected:
        raise UserError(f"export {folder} does not match its config (missing {missing[:3]}, "
                        f"unexpected {sorted(unexpected)[:3]})")
