"""`lengthgen export RUN --out DIR`: a finished run as a Hugging Face folder (docs/export.md).

The folder holds config.json (the wrapper's config, lengthgen's ModelConfig inside it, and a
`lengthgen_export` record: the run's whole config, its step, which file holds what), model.safetensors
(the weights evaluation reads: the EMA where the run kept one), the modelling code (bundle.py), a
tokenizer, generation_config.json, the run's config.toml and a model card (README.md). Parameters
the wrapper has no place for (a trained halting head) go to lengthgen_extra.safetensors, so
`lengthgen eval` on the folder reads the run back whole, and the export says so in one line.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from lengthgen.assembly import Run
from lengthgen.config.schema import to_toml
from lengthgen.errors import UserError, path_problem
from lengthgen.evaluation.evaluate import latest_state, load_assembled, run_folder
from lengthgen.export import bundle, card, tokenizer
from lengthgen.methods.base import Method
from lengthgen.methods.looped.block import LoopedTransformer
from lengthgen.methods.registry import steps_at
from lengthgen.model.transformer import Transformer
from lengthgen.runtime.exported import EXTRA, MARK, PREFIX
from lengthgen.runtime.run_folders import run_lock


def export_run(run: Path, out: Path, force: bool = False) -> list[str]:
    """Write the export of the run folder `run` into `out`; returns the notes (one line each) on
    what the Hugging Face side cannot express. Written beside `out` and renamed into place, so a
    failed export leaves no half folder."""
    run, out = run_folder(Path(run)), Path(out)
    if not run.is_dir():
        raise UserError(f"run folder {run} {path_problem(run, 'folder')}")
    if (run / MARK).is_file() or (run / "config.json").is_file() and not (run / "checkpoints").is_dir():
        raise UserError(f"{run} is an exported folder already; export the run folder it came from")
    with run_lock(run, shared=True):  # no `train --force` replaces the run while it is read
        _, state, assembled = latest_state(run)
        if not state.get("finished"):
            raise UserError(f"{run} is not a finished run (its latest checkpoint is step {state.get('step')} of "
                            f"{assembled.cfg.train.steps}); finish it with lengthgen train --resume --out {run}")
        check_out(out, force, run)
        assembled, model, step = load_assembled(run, torch.device("cpu"))  # the run whose method built the model
        hf, notes = hf_config(assembled, model)
        scratch = out.with_name(f".{out.name}.export.tmp")
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        try:
            write_folder(scratch, run, assembled, model, hf, step, notes)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    if out.exists():
        shutil.rmtree(out)
    scratch.rename(out)
    return notes


def check_out(out: Path, force: bool, run: Path) -> None:
    """--out is new, or (with --force) an earlier export: never a run or another folder."""
    if out.resolve() == run.resolve() or run.resolve() in out.resolve().parents:
        raise UserError(f"--out {out} is inside the run folder {run}; give a folder of its own")
    if not out.exists():
        return
    if not force:
        raise UserError(f"--out {out} exists; give a new folder, or --force to replace an earlier export")
    if not (out / MARK).is_file():
        raise UserError(f"--out {out} exists and is not a lengthgen export; --force replaces only an earlier export")


def family_of(method: Method, model: torch.nn.Module) -> str:
    """ntp (a decoder read token by token), looped (stop rules), or ntp-loop (a looped block run a
    fixed number of times, read token by token): asked of the method and the model it built."""
    if isinstance(model, LoopedTransformer):
        return "looped" if method.has_stop_rules else "ntp-loop"
    if isinstance(model, Transformer):
        return "ntp"
    raise UserError(f"method {method.name} builds a {type(model).__name__}, not a transformer; "
                    "lengthgen export covers the transformer methods")


def hf_config(run: Run, model: torch.nn.Module) -> tuple[dict, list[str]]:
    """(config.json, the notes on what it cannot express)."""
    cfg, method, task = run.cfg, run.method, run.task
    family = family_of(method, model)
    notes = []
    if method.has_halt_head:
        notes.append(f"the {method.name} halting head is not part of the Hugging Face model (the halt stop rule "
                     f"needs lengthgen); it is kept in {EXTRA} for lengthgen eval")
    if type(method).model_batch is not Method.model_batch:
        notes.append(f"method {method.name} lays its batches out anew (pause tokens); the exported model reads "
                     "input_ids as given, so the caller lays them out as lengthgen does")
    if task.answer_region and family == "looped":
        t_max = 2 * steps_at(task, cfg.task.train_max)
    else:
        t_max = 0
    hf = {"architectures": ["LengthgenForCausalLM"], "model_type": "lengthgen",
          "auto_map": {"AutoConfig": "modeling_lengthgen.LengthgenConfig",
                       "AutoModelForCausalLM": "modeling_lengthgen.LengthgenForCausalLM"},
          "lengthgen_model": asdict(cfg.model), "family": family, "injection": getattr(model, "injection", True),
          "loop_steps": int(getattr(method, "n_loops", 0)), "id_head": hasattr(model, "id_head"),
          "default_t_max": t_max, "vocab_size": task.vocab_size, "tie_word_embeddings": cfg.model.tie_embeddings,
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
    bundle.write_sources(folder)
    tokenizer.write_tokenizer(folder, assembled.task, run)
    (folder / "README.md").write_text(card.model_card(run, assembled, hf, step, notes), encoding="utf-8")
    (folder / MARK).write_text(json.dumps({"run": run.name, "step": step}) + "\n")
