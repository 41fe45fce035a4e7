"""The authors' own looped-transformer training step (Fan et al., ICLR 2025, github.com/truongbuu/looped-tf),
timed on this machine, for benchmarks/speed/gpu.py --authors.

It replays the body of the training loop of their src/train.py on their code: their data generator
(generate_training_data.generate_prompt_matrix_parity / _addition), utils.convert_to_one_hot, and their
models.GeneralTransformerModel on their vendored transformers 4.17 GPT-2, built as build_general_model
builds it from their src/conf/<task>.yaml and src/conf/models/<task>.yaml, at the final curriculum
length (n_points = curriculum.points.end, the step their runs spend most of their time in: the
cosine scheduler steps there too).

    from benchmarks.authors.looped_tf import authors_available, authors_step_ms
    why = authors_available(Path(".authors/looped-tf"))      # None when it can run, else why not
    ms = authors_step_ms(Path(".authors/looped-tf"), task="parity", device="cuda", steps=20, warmup=3)

The prepared folder (not in git: .authors/ is ignored) looks like
    .authors/looped-tf/src      `git archive 33650c3 src` of their repository
    .authors/deps311, deps312   what `import models` needs beyond torch, numpy and tqdm, for CPython
                                3.11 / 3.12 (pip install --target --no-deps of their pins):
                                packaging 24.0, regex 2023.12.25, requests 2.28.1, urllib3 1.26.13,
                                charset-normalizer 2.1.1, idna 3.4, certifi 2022.12.7,
                                huggingface-hub 0.22.2 (<1.0: transformers 4.17 imports its
                                `Repository`), PyYAML 6.0.2 (pure Python: its C extension removed),
                                sacremoses 0.1.1 (metadata only: transformers checks that it is
                                installed at import and never imports it here).
Their train.py itself is not imported (it needs quinine, wandb, torch_ema).

By default the step runs in a fresh Python process (same interpreter): their top-level module names
(`models`, `utils`, `transformers`) and pinned dependencies then cannot clash with what the caller
has loaded (a newer transformers or huggingface_hub, say), and the caller's torch settings (TF32,
threads) do not leak into it: torch defaults, as their script has them.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout, for benchmarks.common (also in the fresh process)
COMMIT = "33650c3"  # the revision exported into looped-tf/src
GENERATORS = {"parity": "generate_prompt_matrix_parity", "addition": "generate_prompt_matrix_addition"}


def deps_dir(path: Path) -> Path:
    """The dependency folder for the running interpreter: <path>/../deps<major><minor>."""
    return Path(path).resolve().parent / f"deps{sys.version_info.major}{sys.version_info.minor}"


def _first_line(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text.splitlines()[0] if text.strip() else type(err).__name__


def _missing(path: Path) -> str | None:
    src = Path(path) / "src"
    for name in ("models.py", "utils.py", "generate_training_data.py", "transformers/__init__.py", "conf"):
        if not (src / name).exists():
            return f"{src / name} not found"
    if not deps_dir(path).is_dir():
        return f"{deps_dir(path)} not found (dependencies for Python {sys.version_info.major}.{sys.version_info.minor})"
    return None


# ---------------------------------------------------------------- in this process


@contextlib.contextmanager
def _on_path(path: Path):
    """Their src/ and the dependency folder first on sys.path while the block runs."""
    entries = [str(Path(path).resolve() / "src"), str(deps_dir(path))]
    sys.path[:0] = entries
    try:
        yield
    finally:
        for entry in entries:
            if entry in sys.path:
                sys.path.remove(entry)


def _load(path: Path, name: str):
    """Their src/<name>.py as module `_looped_tf_<name>` (their plain names, `models` and `utils`,
    would clash with the caller's); their `from transformers import ...` finds src/transformers
    first on sys.path."""
    key = f"_looped_tf_{name}"
    if key in sys.modules:
        return sys.modules[key]
    loaded = sys.modules.get("transformers")
    src = Path(path).resolve() / "src"
    if name == "models" and loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(src)):
        raise ImportError(f"another transformers is already imported ({loaded.__file__}); "
                          "run authors_step_ms(..., isolated=True)")
    spec = importlib.util.spec_from_file_location(key, src / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def load_authors(path: Path):
    """(models, utils, generate_training_data) of their src, imported here."""
    with _on_path(path):
        return _load(path, "models"), _load(path, "utils"), _load(path, "generate_training_data")


def task_config(path: Path, task: str) -> dict:
    """Their src/conf/<task>.yaml with its `inherit:` files merged under it (as quinine does)."""
    with _on_path(path):
        import yaml

    def merged(base: dict, over: dict) -> dict:
        out = dict(base)
        for key, value in over.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    conf_dir = Path(path) / "src" / "conf"
    own = yaml.safe_load((conf_dir / f"{task}.yaml").read_text())
    conf: dict = {}
    for parent in own.pop("inherit", []) or []:
        conf = merged(conf, yaml.safe_load((conf_dir / parent).read_text()) or {})
    return merged(conf, own)


def measure(path: Path, task: str = "parity", device: str = "cuda", steps: int = 20, warmup: int = 3,
            length: int | None = None, include_data: bool = True, seed: int = 0) -> dict:
    """Time their training step in this process; see authors_step_ms. Returns a dict with ms
    (the median ms of the timed steps), its quartiles and what was run. Their src/ and dependency folder
    stay first on sys.path meanwhile (anything their code imports late comes from there too)."""
    with _on_path(path):
        return _measure(path, task, device, steps, warmup, length, include_data, seed)


def _measure(path, task, device, steps, warmup, length, include_data, seed) -> dict:
    import torch

    with _their_training(path, task, device, length, seed) as (step, batch, sync, info):  # measure() set the path
        if str(ROOT) not in sys.path:
            sys.path.append(str(ROOT))  # after their src/: their module names win where they clash
        from benchmarks.common.timing import alternate
        # each step on its own clock, synchronised on both sides (their loop reads the device 64
        # times a step anyway); include_data=False draws each batch outside the clock
        timed = alternate({"authors": step}, steps, warmup, draw=None if include_data else batch, sync=sync)
        stats, last = timed["authors"], timed.last["authors"]
    return {"ms": 1000 * stats.median, "q1_ms": 1000 * stats.q1, "q3_ms": 1000 * stats.q3, "task": task,
            "device": device, "steps": steps, "warmup": warmup, **info,
            "include_data": include_data, "last": last, "torch": torch.__version__}


@contextlib.contextmanager
def authors_training(path: Path, task: str = "parity", device: str = "cpu", length: int | None = None,
                     seed: int = 0):
    """Their model, optimizer and loop body, set up as their train() sets them up, in this process
    (their src/ first on sys.path meanwhile): yields (step, batch, sync, info). `step(drawn=None)`
    takes one training step on `drawn` (a `batch()`) or on a batch it draws itself, as their loop
    does; `sync()` waits for the device; `info` says what was built. Arguments as authors_step's."""
    with _on_path(path):
        with _their_training(path, task, device, length, seed) as built:
            yield built


@contextlib.contextmanager
def _their_training(path, task, device, length, seed):
    import numpy as np
    import torch
    import torch.nn as nn

    if task not in GENERATORS:
        raise ValueError(f"task {task!r}: one of {sorted(GENERATORS)}")
    models, utils, data = load_authors(path)
    conf = task_config(path, task)
    model_conf, training = conf["model"], conf["training"]
    points = training["curriculum"]["points"]
    # curriculum.n_points at the end of the curriculum: Curriculum.update_var caps it at points.end.
    # `length` is the longest training operand (their comment: max_num_digits is exclusive, so the
    # longest is n_points - 1).
    n_points = points["end"] if length is None else int(length) + 1
    if n_points < 2:
        raise ValueError(f"length {length}: at least 1")
    bsize = training["batch_size"]
    generate = getattr(data, GENERATORS[task])
    convert_to_one_hot = utils.convert_to_one_hot
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available")

    # Their code calls .cuda() on the model and on every batch. Off CUDA, Tensor.cuda and
    # Module.cuda are patched to .to(device) while the block runs (restored in `finally`), so
    # that the loop body below stays theirs verbatim.
    saved = (torch.Tensor.cuda, nn.Module.cuda)
    if dev.type != "cuda":
        torch.Tensor.cuda = lambda self, *a, **k: self.to(dev)
        nn.Module.cuda = lambda self, *a, **k: self.to(dev)
    try:
        np.random.seed(seed)
        torch.manual_seed(seed)
        # build_general_model(args.model), then main(): .to(float32), .cuda(), .train()
        model = models.GeneralTransformerModel(
            n_dims=model_conf["n_dims"], n_positions=model_conf["n_positions"], n_embd=model_conf["n_embd"],
            n_layer=model_conf["n_layer"], n_head=model_conf["n_head"],
            linear_embedding=model_conf.get("linear_embedding", False))
        model = model.to(torch.float32)
        model.cuda()
        model.train()
        # train(): optimizer, scheduler, loss
        optimizer = torch.optim.AdamW(model.parameters(), lr=training["learning_rate"])
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            optimizer, training["train_steps"] - points["end"] * points["interval"], eta_min=0.0)
        loss_func = nn.CrossEntropyLoss()

        def batch():
            xs, batch_num, ys, mask = generate(bsize, min_num_digits=1, max_num_digits=n_points,
                                               max_len=n_points + 1)
            xs = torch.tensor(convert_to_one_hot(xs))
            return xs, batch_num, ys, mask

        def step(drawn=None):
            # the body of train()'s `for i in pbar:` for a task other than multi and dict, at a
            # step past the curriculum (i > end * interval: the scheduler steps; ema is off in
            # their confs). Left out: the wandb/print logging every 10 steps and the tests every 1000.
            xs, batch_num, ys, mask = batch() if drawn is None else drawn
            xs = xs.cuda()
            ys = ys.cuda()
            with torch.enable_grad():
                optimizer.zero_grad()
                states = model.looped_forward(xs, horizon=n_points + 2)
                states_list = []
                for t in range(bsize):
                    states_list.append(states[batch_num[t].item() - 1][t])
                outputs = torch.stack(states_list)
                loss = loss_func(outputs[mask == 1], ys[mask == 1])
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # noqa: F841
                optimizer.step()
                scheduler.step()
            # pbar.set_description(f"loss {loss}"): formatting the loss reads it back (a sync per step)
            return f"loss {loss}"

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        yield step, batch, sync, {
            "n_points": n_points, "horizon": n_points + 2, "batch_size": bsize,
            "n_layer": model_conf["n_layer"], "n_head": model_conf["n_head"], "n_embd": model_conf["n_embd"]}
    finally:
        torch.Tensor.cuda, nn.Module.cuda = saved


# ---------------------------------------------------------------- in a fresh process

_CHILD = """
import importlib.util, json, sys
sys.path = [p for p in sys.path if p not in ('', '.')]
spec = importlib.util.spec_from_file_location('_authors_looped', sys.argv[1])
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
mod._child(json.loads(sys.argv[2]))
"""


def _child(request: dict) -> None:
    """Runs in the fresh process: prints one JSON line, the result or {"error": first line}."""
    action = request.pop("action")
    try:
        if action == "check":
            load_authors(Path(request["path"]))
            if request.get("device") == "cuda":
                import torch
                if not torch.cuda.is_available():
                    raise RuntimeError("CUDA is not available")
            out = {"ok": True}
        else:
            out = measure(Path(request.pop("path")), **request)
    except Exception as err:  # reported to the caller, which decides
        out = {"error": _first_line(err)}
    print("\n" + json.dumps(out), flush=True)


def _run_child(request: dict, timeout: float | None) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).resolve()), json.dumps(request)],
                          capture_output=True, text=True, timeout=timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    return {"error": tail[-1] if tail else f"child exited {proc.returncode} with no output"}


def authors_available(path: Path, device: str | None = None, isolated: bool = True) -> str | None:
    """None when the authors' step can run from `path` (the folder holding their src/), else why not:
    a missing file, or the first line of the error importing their models, utils and data generator
    (with device="cuda", also a missing GPU)."""
    why = _missing(Path(path))
    if why:
        return why
    if isolated:
        return _run_child({"action": "check", "path": str(Path(path).resolve()), "device": device}, 300).get("error")
    try:
        load_authors(Path(path))
    except Exception as err:
        return _first_line(err)
    return None


def authors_step_ms(path: Path, task: str = "parity", device: str = "cuda", steps: int = 20, warmup: int = 3,
                    length: int | None = None, include_data: bool = True, seed: int = 0,
                    isolated: bool = True, timeout: float | None = None) -> float:
    """Median ms per training step of the authors' code (authors_step's "ms")."""
    return authors_step(path, task, device, steps, warmup, length, include_data, seed, isolated, timeout)["ms"]


def authors_step(path: Path, task: str = "parity", device: str = "cuda", steps: int = 20, warmup: int = 3,
                 length: int | None = None, include_data: bool = True, seed: int = 0,
                 isolated: bool = True, timeout: float | None = None) -> dict:
    """The authors' training step timed: `warmup` steps, then `steps` steps, each timed on its own
    (torch.cuda.synchronize before and after on CUDA: benchmarks/common/timing.py); the median ms
    ("ms"), its quartiles and what was run.

    task: "parity" or "addition". length: the longest training operand (lengthgen's task.train_max);
    None takes their config's final curriculum length (n_points = points.end: parity 21, addition
    20, i.e. length 20 and 19). include_data=False draws each timed step's batch outside the clock
    (their numpy generator and one-hot loop then cost nothing); by default each step draws its own,
    as their loop does. isolated=False runs it in this process (their modules are imported here, and
    stay). Raises RuntimeError with the first line of the error when it fails."""
    path = Path(path)
    why = _missing(path)
    if why:
        raise RuntimeError(why)
    request = {"task": task, "device": device, "steps": steps, "warmup": warmup, "length": length,
               "include_data": include_data, "seed": seed}
    if not isolated:
        return measure(path, **request)
    out = _run_child({"action": "measure", "path": str(path.resolve()), **request}, timeout)
    if "error" in out:
        raise RuntimeError(f"authors' step ({task}, {device}): {out['error']}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", default=str(ROOT / ".authors/looped-tf"))
    p.add_argument("--tasks", default="parity,addition")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--length", type=int, default=None)
    p.add_argument("--no-data", action="store_true", help="draw each timed step's batch outside the clock")
    sys.path.insert(0, str(ROOT))
    from benchmarks.common import records
    records.add_arguments(p)
    args = p.parse_args()
    why = authors_available(Path(args.path), args.device)
    if why:
        sys.exit(f"not available: {why}")
    results = {"commit": COMMIT}
    for task in args.tasks.split(","):
        results[task] = authors_step(Path(args.path), task=task, device=args.device, steps=args.steps,
                                     warmup=args.warmup, length=args.length, include_data=not args.no_data)
        print(f"{task}: {results[task]['ms']:.2f} ms/step (quartiles {results[task]['q1_ms']:.2f}-"
              f"{results[task]['q3_ms']:.2f}; authors' looped-tf {COMMIT}, {args.device})", flush=True)
    records.write(__file__, args, results, device=args.device)


if __name__ == "__main__":
    main()
