"""Checkpoints: safetensors weights + JSON sidecar, optimizer state beside.

Layout inside a run folder:

    checkpoints/step_00000500/model.safetensors   weights of the (unwrapped) model
    checkpoints/step_00000500/ema.safetensors     EMA weights, when optim.ema > 0
    checkpoints/step_00000500/optimizer.pt        optimizer state (tensors and numbers only)
    checkpoints/step_00000500/state.json          config, step, RNG states, sha256 of the other files
    checkpoints/latest                            name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder and renamed into place,
then `latest` is replaced atomically, so a run killed at any moment leaves the
previous checkpoint intact. Loading never unpickles code: safetensors holds
only tensors and the optimizer file is read with `weights_only=True`. Loading
checks state.json's keys and types and each file against its recorded sha256
(a flipped byte in a weight file is still a valid file), so a damaged
checkpoint is a one-line UserError, never a traceback or silently wrong weights.
state.json holds a digest of its own too (`state_sha256`, over its other content), so an edited
config or step is refused rather than used. Checkpoints written before the file digests were
recorded (2026-11-23) load unchecked, and state.json files written before their own digest
(2026-11-27) load without that check.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from lengthgen.errors import ResourceError, UserError
from lengthgen.runtime.resources import DISK_FULL, NOT_WRITABLE, human_bytes, os_error_line

LATEST = "latest"
SELF_DIGEST = "state_sha256"  # state.json's own digest (see state_digest)
# state.json's keys: (Python type, JSON type, required); checkpoints before digests have no "sha256",
# and those before 2026-11-27 no SELF_DIGEST
STATE_KEYS = {"config": (dict, "object", True), "step": (int, "integer", True), "data_rng": (str, "string", True),
              "torch_rng": (str, "string", True), "finished": (bool, "boolean", False),
              "sha256": (dict, "object", False), SELF_DIGEST: (str, "string", False)}
RNG_BYTES = torch.get_rng_state().numel()  # a CPU generator's state, as encode_state writes it


def state_digest(state: dict) -> str:
    """sha256 of state.json's content without its own digest, serialised canonically (sorted keys,
    no spaces): JSON numbers and strings read back to the same text, so the digest does not depend
    on how the file was indented."""
    content = {k: v for k, v in state.items() if k != SELF_DIGEST}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """`path` holds `text` whole, or is left as it was: a full disk leaves no partial file behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def encode_state(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def decode_state(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)


def restore_rng(path: Path, state: dict, data: torch.Generator) -> None:
    """Set the data stream's and torch's RNG to checkpoint `path`'s."""
    for key, set_state in (("data_rng", data.set_state), ("torch_rng", torch.set_rng_state)):
        try:
            set_state(decode_state(state[key]))
        except (ValueError, RuntimeError) as err:  # bad base64, or not a generator state of the right size
            raise UserError(f"checkpoint {path / 'state.json'} has a corrupt {key}: "
                            f"{str(err).splitlines()[0]}") from None


def sha256(file: Path) -> str:
    try:
        return hashlib.sha256(file.read_bytes()).hexdigest()
    except OSError as err:
        raise UserError(f"checkpoint file {file} cannot be read: {err.strerror}") from None


@contextlib.contextmanager
def own_values(model):
    """The model with every parameter holding its own values while it is written: a seed trained
    stacked (lengthgen.accel.stacked) has views of every seed's rows, which safetensors refuses."""
    views = [(p, p.data) for p in model.parameters() if p.untyped_storage().nbytes() > p.nbytes]
    for p, view in views:
        p.data = view.clone()
    try:
        yield model
    finally:
        for p, view in views:
            p.data = view


def save(folder: Path, step: int, model, optimizer, ema, state: dict, keep: int = 1) -> Path:
    """Write checkpoint `step` under folder/checkpoints and point `latest` at it."""
    root = folder / "checkpoints"
    name = f"step_{step:08d}"
    tmp = root / f".{name}.tmp"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        with own_values(model):
            save_model(model, str(tmp / "model.safetensors"))
        if ema is not None:
            save_model(ema, str(tmp / "ema.safetensors"))
        # serialised in memory, written by Python: a full disk is then an OSError naming the file
        # (torch.save's own writer reports it as "unexpected pos 55808 vs 55696")
        serialised = io.BytesIO()
        torch.save(portable_state(optimizer), serialised)
        (tmp / "optimizer.pt").write_bytes(serialised.getbuffer())
        digests = {file.name: sha256(file) for file in sorted(tmp.iterdir())}
        content = {**state, "step": step, "sha256": digests}
        (tmp / "state.json").write_text(json.dumps({**content, SELF_DIGEST: state_digest(content)}, indent=1))
        # safetensors writes its files 0600; every file of a run gets the mode the umask gives the others
        # (state.json's), so a colleague on a shared filesystem can evaluate the run
        mode = (tmp / "state.json").stat().st_mode & 0o777
        for file in tmp.iterdir():
            file.chmod(mode)
    except (OSError, SafetensorError) as err:
        shutil.rmtree(tmp, ignore_errors=True)  # never left half-written, never pointed to
        raise checkpoint_fault(err, folder, step, (model, ema, optimizer)) from None
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_atomic(root / LATEST, name)
    old = sorted(p for p in root.glob("step_*") if p.name != name)
    for stale in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def tensor_bytes(obj) -> int:
    """Bytes of every tensor inside nested dicts and lists (a state dict, an optimizer's)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(map(tensor_bytes, obj.values()))
    return sum(map(tensor_bytes, obj)) if isinstance(obj, (list, tuple)) else 0


def checkpoint_fault(err: Exception, folder: Path, step: int, parts) -> Exception:
    """A checkpoint that could not be written as one line: the path, the bytes it needs, the bytes
    free and the complete checkpoint that stays `latest`. Any other error comes back as is."""
    if isinstance(err, SafetensorError):  # "I/O error: No space left on device (os error 28)"
        code = re.search(r"os error (\d+)", str(err))
        if not code:
            return err
        err = OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(folder / "checkpoints"))
    if err.errno not in DISK_FULL | NOT_WRITABLE:
        return err
    size = tensor_bytes([part.state_dict() for part in parts if part is not None])
    try:
        free = f", {human_bytes(shutil.disk_usage(folder).free)} free"  # the failed checkpoint is gone by now
    except OSError:
        free = ""
    good = latest(folder)
    kept = f"the last complete checkpoint, {good.name}, stays latest" if good else "no checkpoint had been written"
    return ResourceError(f"{os_error_line(err)} (checkpoint step {step} needs about {human_bytes(size)}{free}); {kept}")


def latest(folder: Path) -> Path | None:
    """The newest complete checkpoint, as `latest` names it. The pointer names a step folder of its
    own run and nothing else (not a path); a damaged or missing one is skipped with a note for the
    newest complete step folder, as a checkpoint's own files are whole or absent (a kill between
    renaming a checkpoint into place and writing `latest` leaves one so). None: no checkpoint."""
    root = folder / "checkpoints"
    pointer = root / LATEST
    if not pointer.is_file() and not pointer.is_symlink():
        return newest_complete(root, f"{pointer} is missing") if root.is_dir() else None
    try:
        name = pointer.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        name = ""
    if re.fullmatch(r"step_\d{8}", name):
        path = root / name
        if not (path / "state.json").is_file():
            raise UserError(f"checkpoint {path} named by {pointer} is missing or incomplete")
        return path
    found = newest_complete(root, f"{pointer} is damaged")
    if found is None:
        raise UserError(f"{pointer} is damaged ({name[:40]!r} is not a step_NNNNNNNN checkpoint of this run) "
                        "and no complete checkpoint is left beside it")
    return found


def newest_complete(root: Path, why: str) -> Path | None:
    """The newest step folder under `root` that holds its state.json (written last), noted with `why`."""
    complete = sorted(p for p in root.glob("step_*") if re.fullmatch(r"step_\d{8}", p.name) and (p / "state.json").is_file())
    if complete:
        print(f"lengthgen: note: {why}; using the newest complete checkpoint, {complete[-1].name}", file=sys.stderr)
    return complete[-1] if complete else None


def read_state(path: Path) -> dict:
    """state.json of checkpoint `path`, with the keys every checkpoint holds checked (present, of
    the right JSON type) so that no caller meets a KeyError. Its config is a dict: the caller
    assembles it (lengthgen.assembly.runs.saved_run, naming the checkpoint)."""
    file = path / "state.json"
    try:
        state = json.loads(file.read_text())
    except (OSError, ValueError) as err:  # ValueError: bad JSON or bad UTF-8
        raise UserError(f"checkpoint {file} is unreadable: {err}") from None
    if not isinstance(state, dict):
        raise UserError(f"checkpoint {file} is corrupt: it holds a JSON {type(state).__name__}, not an object")
    for key, (kind, json_name, required) in STATE_KEYS.items():
        value = state.get(key)
        wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))  # True is an int
        if wrong and (required or key in state):
            raise UserError(f"checkpoint {file} is corrupt: {key!r} must be a JSON {json_name}, got {value!r:.40}")
    if state["step"] < 0 or not all(isinstance(d, str) for d in state.get("sha256", {}).values()):
        raise UserError(f"checkpoint {file} is corrupt: a negative 'step' or a 'sha256' entry that is not a string")
    check_rng_sizes(file, state)  # before the digest: a damaged RNG state is named as such
    if SELF_DIGEST in state and state[SELF_DIGEST] != state_digest(state):  # absent: written before 2026-11-27
        raise UserError(f"checkpoint {file} was changed after it was written (its content no longer matches its "
                        f"{SELF_DIGEST}); nothing is loaded from it: undo the edit or restore the file")
    return state


def check_rng_sizes(file: Path, state: dict) -> None:
    """Each RNG state decodes to a CPU generator's state (the data stream's and torch's both are)."""
    for key in ("data_rng", "torch_rng"):
        try:
            size = decode_state(state[key]).numel()
        except (ValueError, RuntimeError) as err:  # bad base64
            raise UserError(f"checkpoint {file} has a corrupt {key}: {str(err).splitlines()[0]}") from None
        if size != RNG_BYTES:
            raise UserError(f"checkpoint {file} has a corrupt {key}: {size} bytes, not a generator state "
                            f"of {RNG_BYTES}")


def check_digest(file: Path, digests: dict | None) -> None:
    """Compare `file` with the sha256 in `digests`, its checkpoint state's "sha256" (callers
    have read the state already). None: a checkpoint written before digests were recorded,
    or a file outside a checkpoint, is not checked."""
    if digests is None:
        return
    if file.name not in digests:
        raise UserError(f"checkpoint file {file} is not one its state.json records")
    if sha256(file) != digests[file.name]:
        raise UserError(f"checkpoint file {file} is corrupt: its sha256 differs from the one recorded in state.json")


def load_weights(module, file: Path, digests: dict | None = None) -> None:
    check_digest(file, digests)
    try:
        missing, unexpected = load_model(module, str(file), strict=False)
    except (SafetensorError, OSError, RuntimeError, ValueError) as err:
        raise UserError(f"checkpoint {file} is corrupt or does not match the model: {str(err).splitlines()[0]}") from None
    if missing or unexpected:
        raise UserError(f"checkpoint {file} does not match the model (missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")


def load_optimizer(optimizer, file: Path, digests: dict | None = None) -> None:
    check_digest(file, digests)
    try:
        saved = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # any failure here means the file is not a usable optimizer state
        raise UserError(f"optimizer state {file} is corrupt: {str(err).splitlines()[0]}") from None
    check_optimizer_shapes(optimizer, saved, file)
    try:
        optimizer.load_state_dict(saved)
    except Exception as err:
        raise UserError(f"optimizer state {file} is corrupt: {str(err).splitlines()[0]}") from None


def portable_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state dict as an eager run on any device reads it: lr a number, not
    capturable, step counts on the CPU (a checkpoint written by a recorded run resumes anywhere),
    each tensor holding its own values only (lengthgen.accel.stacked)."""
    saved = optimizer.state_dict()
    saved["state"] = {index: dict(slots) for index, slots in saved["state"].items()}  # not the live state's dicts
    for group in saved["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
        if group.get("capturable"):
            group["capturable"] = False
    for state in saved["state"].values():
        if isinstance(state.get("step"), torch.Tensor) and state["step"].device.type != "cpu":
            state["step"] = state["step"].detach().to("cpu")
        for name, value in state.items():  # a seed trained stacked holds views of every seed's rows: its own only
            if isinstance(value, torch.Tensor) and value.untyped_storage().nbytes() > value.nbytes:
                state[name] = value.clone()
    return saved


def check_optimizer_shapes(optimizer, saved, file: Path) -> None:
    """load_state_dict checks only parameter counts: the state of a model of another width
    would load, then fail at the first step with a size mismatch."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    slots = saved.get("state") if isinstance(saved, dict) else None
    if not isinstance(slots, dict):
        raise UserError(f"optimizer state {file} is corrupt: it holds no per-parameter state")
    for index, slot in slots.items():
        if not (isinstance(index, int) and 0 <= index < len(params) and isinstance(slot, dict)):
            raise UserError(f"optimizer state {file} does not match the model: "
                            f"it has state for parameter {index!r:.20}")
        for name, value in slot.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[index].shape:
                raise UserError(f"optimizer state {file} does not match the model: its {name} of parameter {index} "
                                f"has shape {tuple(value.shape)}, the parameter {tuple(params[index].shape)}")
