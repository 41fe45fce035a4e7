"""`lengthgen export RUN --out DIR`: a finished run as a Hugging Face folder (docs/export.md).

The folder holds config.json (the wrapper's config, lengthgen's ModelConfig inside it, the bounds of
its counts, and a `lengthgen_export` record: the run's whole config, its step, which file holds what),
model.safetensors (the weights evaluation reads: the EMA where the run kept one), the modelling code
(bundle.py), a tokenizer, generation_config.json, the run's config.toml, a model card (README.md) and
last the mark, lengthgen_export.json, with the sha256 of every file written. Parameters the wrapper
has no place for (a trained halting head) go to lengthgen_extra.safetensors, so `lengthgen eval` on
the folder reads the run back whole, and the export says so in one line.

One export writes a folder at a time (OutLock, the lock `train` and `eval` take), into a temporary
folder of its own beside --out that is renamed into place, or removed whatever stops it. `--force`
replaces only an earlier export holding nothing but the files that export wrote.
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from lengthgen.assembly.runs import Run
from lengthgen.config.schema import parse_lengths, to_toml
from lengthgen.errors import ConfigError, ResourceError, UserError, path_problem
from lengthgen.evaluation.bounds import TOKEN_FACTOR, loop_cap
from lengthgen.evaluation.evaluate import latest_state, load_assembled, run_folder
from lengthgen.export import bundle, card, tokenizer
from lengthgen.methods.base import Method, steps_at
from lengthgen.methods.looped.block import LoopedTransformer
from lengthgen.model.transformer import Transformer
from lengthgen.results.rows import read_rows
from lengthgen.runtime.checkpoint import sha256
from lengthgen.runtime.exported import EXTRA, MARK, PREFIX
from lengthgen.runtime.resources import os_error_line
from lengthgen.runtime.run_folders import OutLock, check_writable, run_lock

# the files of an export besides its modelling code (the .py files bundle.py writes)
OWN_FILES = {"config.json", "model.safetensors", EXTRA, "tokenizer.json", "tokenizer_config.json",
             "generation_config.json", "README.md", "config.toml", MARK}
SCRATCH = ".export.tmp"  # the temporary folder's suffix: .<out>.<random>.export.tmp beside --out


def export_run(run: Path, out: Path, force: bool = False) -> list[str]:
    """Write the export of the run folder `run` into `out`; returns the notes (one line each) on
    what the Hugging Face side cannot express. Nothing is left behind by a failure: no half folder,
    no temporary one, and an earlier export replaced with --force stays until the new one is whole."""
    run, out = run_folder(Path(run)), Path(out)
    if not run.is_dir():
        raise UserError(f"run folder {run} {path_problem(run, 'folder')}")
    if (run / MARK).is_file() or (run / "config.json").is_file() and not (run / "checkpoints").is_dir():
        raise UserError(f"{run} is an exported folder already; export the run folder it came from")
    check_out_path(out, run)
    with run_lock(run, shared=True), OutLock(out):  # no `train --force` replaces the run; one writer of --out
        _, state, assembled = latest_state(run)
        if not state.get("finished"):
            raise UserError(f"{run} is not a finished run (its latest checkpoint is step {state.get('step')} of "
                            f"{assembled.cfg.train.steps}); finish it with lengthgen train --resume --out {run}")
        check_out(out, force)
        assembled, model, step = load_assembled(run, torch.device("cpu"))  # the run whose method built the model
        hf, notes = hf_config(assembled, model, known_lengths(run, assembled))
        scratch = new_scratch(out)
        try:
            write_folder(scratch, run, assembled, model, hf, step, notes)
            put_in_place(scratch, out)
        except (OSError, SafetensorError) as err:
            raise write_fault(err, out) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # gone once renamed; removed on any failure
    return notes


def check_out_path(out: Path, run: Path) -> None:
    """--out names a folder of its own: not a link, a file, the run or a folder around the run or the
    current folder (checked before anything is locked or read)."""
    if out.is_symlink():
        dangling = "" if out.exists() else ", which does not exist"
        raise UserError(f"--out {out} is a symbolic link to {os.readlink(out)}{dangling}; an export is written where "
                        "--out names, never through a link: give a folder of its own")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} {path_problem(out, 'folder')}; give a folder for the export")
    target, source, here = out.resolve(), run.resolve(), Path.cwd().resolve()
    where = ("is the run folder" if target == source else "is inside the run folder" if source in target.parents
             else "holds the run folder" if target in source.parents else "")
    if where:
        raise UserError(f"--out {out} {where} {run}; give a folder of its own")
    if target == here or target in here.parents:
        raise UserError(f"--out {out} is the current folder or holds it; give a folder of its own")


def check_out(out: Path, force: bool) -> None:
    """--out is new, or (with --force) an earlier export that holds only what that export wrote:
    never a run, an evaluation's eval.csv, a reproduction or a user's files."""
    if not out.exists():
        return
    if not force:
        raise UserError(f"--out {out} exists; give a new folder, or --force to replace an earlier export")
    if not (out / MARK).is_file():
        raise UserError(f"--out {out} exists and is not a lengthgen export; --force replaces only an earlier export")
    mine = written_files(out)
    others = sorted(p.name for p in out.iterdir() if p.name not in mine and not leftover(p.name))
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise UserError(f"--force replaces only the files an earlier export wrote, and {out} also holds {others[0]}"
                        f"{more}; move {'them' if more else 'it'} away or give another --out")


def leftover(name: str) -> bool:  # an atomic write's hidden temporary file, or an evaluation's held lock
    return name.startswith(".") and (name.endswith(".tmp") or name.endswith(".lock"))


def written_files(out: Path) -> set[str]:
    """The files the export in `out` wrote: as its mark records them, or (an export written before
    the mark listed them) the files every export writes and the modelling code's."""
    try:
        recorded = json.loads((out / MARK).read_text(encoding="utf-8")).get("sha256")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, dict):
        return set(recorded) | {MARK}
    return OWN_FILES | set(bundle.sources())


def known_lengths(run: Path, assembled: Run) -> list[int]:
    """The lengths the run was trained or evaluated at: its training maximum, its eval.lengths and
    every length of its eval.csv; the bounds of the exported model's counts are derived from them."""
    cfg = assembled.cfg
    lengths = [cfg.task.train_max]
    try:
        lengths += parse_lengths(cfg.eval.lengths)
    except (ConfigError, ValueError):
        pass
    try:
        lengths += [r["length"] for r in read_rows(run / "eval.csv")] if (run / "eval.csv").is_file() else []
    except (OSError, UserError):
        pass
    return sorted(set(lengths))


def new_scratch(out: Path) -> Path:
    """A temporary folder of this process beside --out, named .<out>.<random>.export.tmp; those of
    exports killed before they could remove theirs go first (no other export of --out runs: its
    lock is held)."""
    check_writable(out.parent, "give a folder you can write (--out)")
    for stale in out.parent.glob(f".{glob_escape(out.name)}.{'?' * 8}{SCRATCH}"):  # mkdtemp's 8 random letters:
        shutil.rmtree(stale, ignore_errors=True)  # never the scratch of --out NAME.x, another export's
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=SCRATCH, dir=out.parent))
    scratch.chmod(0o777 & ~current_umask())  # mkdtemp makes it 0700: the folder a colleague reads
    return scratch


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def put_in_place(scratch: Path, out: Path) -> None:
    """The written folder renamed to --out; an earlier export is set aside first and removed only
    once the new one is in place (a failure in between puts it back)."""
    if not out.exists():
        scratch.rename(out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old" + SCRATCH, dir=out.parent))
    old.rmdir()
    out.rename(old)
    try:
        scratch.rename(out)
    except OSError:
        old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_fault(err: Exception, out: Path) -> Exception:
    """A failed write as one line: a full disk, a folder it cannot write, anything else of the OS;
    safetensors' own error (a full disk while writing the weights) read for its OS error code."""
    if isinstance(err, SafetensorError):  # "I/O error: File too large (os error 27)": the OS error inside
        found = re.search(r"os error (\d+)|code: (\d+)", str(err))
        code = int(found.group(1) or found.group(2)) if found else errno.EIO
        err = OSError(code, os.strerror(code) if found else str(err).splitlines()[0], str(out / "model.safetensors"))
    if err.errno == errno.ENOTEMPTY or err.errno == errno.EEXIST:
        return UserError(f"--out {out} was written by another process meanwhile; nothing exported: give another --out")
    return ResourceError(f"export to {out} failed, nothing written: {os_error_line(err)}")


def family_of(method: Method, model: torch.nn.Module) -> str:
    """ntp (a decoder read token by token), looped (stop rules), or ntp-loop (a looped block run a
    fixed number of times, read token by token): asked of the method and the model it built."""
    if isinstance(model, LoopedTransformer):
        return "looped" if method.has_stop_rules else "ntp-loop"
    if isinstance(model, Transformer):
        return "ntp"
    raise UserError(f"method {method.name} builds a {type(model).__name__}, not a transformer; "
                    "lengthgen export covers the transformer methods")


def own_way(method: Method, name: str) -> str | None:
    """`module.Class.name` where the method overrides Method's `name` (e.g. model_batch), else None."""
    function = getattr(type(method), name)
    return None if function is getattr(Method, name) else f"{function.__module__}.{function.__qualname__}"


def hf_config(run: Run, model: torch.nn.Module, lengths: list[int]) -> tuple[dict, list[str]]:
    """(config.json, the notes on what it cannot express). `lengths`: those the run was trained or
    evaluated at, from which the bounds of the model's counts are derived (evaluation/bounds.py)."""
    cfg, method, task = run.cfg, run.method, run.task
    family = family_of(method, model)
    notes = []
    if method.has_halt_head:
        notes.append(f"the {method.name} halting head is not part of the Hugging Face model (the halt stop rule "
                     f"needs lengthgen); it is kept in {EXTRA} for lengthgen eval")
    layout = own_way(method, "model_batch")
    if layout:  # ntp-pause inserts pause tokens, encoder blanks the question's '=' and the answer slots, ...
        notes.append(f"method {method.name} lays its batches out anew ({layout}); the exported model reads "
                     "input_ids as given, so the caller lays them out as that function does")
    looped = task.answer_region and family == "looped"
    longest = max(lengths)
    generated = card.answer_tokens(task, longest) if task.answer_region else longest  # a text run: a window
    hf = {"architectures": ["LengthgenForCausalLM"], "model_type": "lengthgen",
          "auto_map": {"AutoConfig": "modeling_lengthgen.LengthgenConfig",
                       "AutoModelForCausalLM": "modeling_lengthgen.LengthgenForCausalLM"},
          "lengthgen_model": asdict(cfg.model), "family": family, "injection": getattr(model, "injection", True),
          "loop_steps": int(getattr(method, "n_loops", 0)), "id_head": hasattr(model, "id_head"),
          "default_t_max": 2 * steps_at(task, cfg.task.train_max) if looped else 0,
          "max_num_steps": loop_cap(task, lengths) if family == "looped" else 0,
          "max_new_tokens_cap": TOKEN_FACTOR * generated, "bounds_from_length": longest,
          "vocab_size": task.vocab_size, "tie_word_embeddings": cfg.model.tie_embeddings,
          "pad_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32"}
    return hf, notes


def split_weights(model: torch.nn.Module, hf: dict) -> tuple[dict, dict]:
    """({hf key: tensor} for model.safetensors, {lengthgen key: tensor} the wrapper has no place for)."""
    with torch.device("meta"):  # only the names of the wrapper's parameters
        plain = (Transformer(model.cfg, hf["vocab_size"]) if hf["family"] == "ntp"
                 else LoopedTransformer(model.cfg, hf["vocab_size"]))
        if hf["id_head"]:
            plain.id_head = torch.nn.Linear(1, 1)
    names = {name.split(".")[0] for name in plain.state_dict()}
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if hf["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)  # one matrix; both sides tie it again on loading
    kept = {PREFIX + k: v for k, v in state.items() if k.split(".")[0] in names}
    extra = {k: v for k, v in state.items() if k.split(".")[0] not in names}
    return kept, extra


def write_folder(folder: Path, run: Path, assembled: Run, model, hf: dict, step: int, notes: list[str]) -> None:
    kept, extra = split_weights(model, hf)
    save_file(kept, str(folder / "model.safetensors"), metadata={"format": "pt"})
    if extra:
        save_file(extra, str(folder / EXTRA), metadata={"format": "pt"})
    cfg = assembled.cfg
    hf["lengthgen_export"] = {"run": run.name, "step": step, "config": json.loads(json.dumps(asdict(cfg))),
                              "extra": EXTRA if extra else None}
    (folder / "config.json").write_text(json.dumps(hf, indent=1) + "\n")
    (folder / "config.toml").write_text(to_toml(cfg))
    generation = {"pad_token_id": 0, "eos_token_id": 1, "do_sample": False, "num_beams": 1,
                  "max_new_tokens": card.answer_tokens(assembled.task, cfg.task.train_max)}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1) + "\n")
    bundle.write_sources(folder, assembled.scheme)
    tokenizer.write_tokenizer(folder, assembled.task, run)
    (folder / "README.md").write_text(card.model_card(run, assembled, hf, step, notes), encoding="utf-8")
    # safetensors writes its files 0600: every file gets the mode the umask gives the others, as a checkpoint's
    mode = (folder / "config.json").stat().st_mode & 0o777
    for file in folder.iterdir():
        file.chmod(mode)
    digests = {file.name: sha256(file) for file in sorted(folder.iterdir())}
    (folder / MARK).write_text(json.dumps({"run": run.name, "step": step, "sha256": digests}, indent=1) + "\n")
    (folder / MARK).chmod(mode)
