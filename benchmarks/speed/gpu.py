"""One GPU benchmark: what a training step costs on one GPU, every way lengthgen can run it.

Prints, measured in one run on one device (ratios are meaningful; absolute times drift); every
step is the trainer's own (Trainer.step, benchmarks/common/steps.py), drawing its batch on the host
as training does, and the variants of each table take turns (benchmarks/common/timing.py):
1. Looped Parity and Addition at the paper presets (experiments/looped/paper/, at the final
   curriculum length: batch 64, lengths mixed from 1 to train_max): ms per training step
   eager, captured (train.capture: the whole step replayed from CUDA graphs,
   lengthgen.accel.captured), compiled (train.compile: the blocks) and compiled + captured
   (the recorded loss compiled whole, every iteration and the backward, as training does). With
   --authors PATH (a folder holding looped-tf/src, see benchmarks/authors/looped_tf.py), the
   authors' step on the same device.
2. The GPU-busy share of eager and captured steps: kernel time over wall time (torch profiler),
   and the kernels a step launches.
3. Correct before fast: eager and captured training from one seed, same batches; the largest
   relative difference of their losses over the steps, and of the final weights.
4. Several runs per GPU: P processes each training the Parity step at once; steps per second of
   all of them over one process's.
5. Seeds stacked (lengthgen.accel.stacked): S seeds of the Parity and Addition presets trained
   as one model, captured on CUDA: ms per stacked step and per run, against one run's step; and
   each seed's losses against its own run's over the same batches (--stack-compile: also the
   stacked step compiled whole, as train.compile records it).
6. TRA, CoPE and FoX against RoPE on the TRA paper's flip-flop preset
   (experiments/tra/paper/flipflop.toml): ms per step and the ratio to RoPE's, eager and
   captured (their attention fused on CUDA: lengthgen.model.content_attention.fused).

    python benchmarks/speed/gpu.py [--device cuda] [--steps 30] [--procs 1,4] [--stack 3] [--authors .authors]
    python benchmarks/speed/gpu.py --device cpu     # small shapes, eager only: keeps the script alive in CI

About 6 minutes on one H200 with every part (compiling takes most of it; --no-compile skips it);
what each part costs: benchmarks/gpu_check.sh.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout: lengthgen and benchmarks.common without an install

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import StackedStep, TrainerStep, sync  # noqa: E402
from benchmarks.common.timing import alternate, time_one  # noqa: E402
from lengthgen.assembly.runs import new_run, new_run_config  # noqa: E402
from lengthgen.runtime.devices import pick_device  # noqa: E402

LOOPED = {"parity": ROOT / "experiments/looped/paper/parity.toml",
          "addition": ROOT / "experiments/looped/paper/addition.toml"}
FLIPFLOP = ROOT / "experiments/tra/paper/flipflop.toml"
SMALL = ["model.d_model=32", "model.n_head=2", "task.train_max=6", "train.batch_size=16"]  # --device cpu
SMALL_FLIPFLOP = ["model.d_model=32", "model.n_head=2", "model.n_layer=1", "task.train_min=16", "task.train_max=16",
                  "train.batch_size=8"]


def load(preset: Path, device: torch.device, small: list[str], extra: list[str] = ()):
    overrides = [f"train.device={device.type}", *(small if device.type == "cpu" else []), *extra]
    return new_run(preset, overrides)


def failed(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"failed: {type(err).__name__}: {text[0][:200] if text else ''}"


def built(make) -> tuple[object | None, str | None]:
    """(the stepper, None), or (None, why) where building it failed (compiling, recording)."""
    try:
        return make(), None
    except Exception as err:  # one variant failing leaves the others measured
        return None, failed(err)


def stacked_rows(task: str, device: torch.device, seeds: int, args) -> dict:
    """ms per stacked step of `seeds` seeds and per run, one run's step (captured on CUDA) beside
    it, taking turns; and each seed's losses against its own run's over the same batches."""
    run, cuda = load(LOOPED[task], device, SMALL), device.type == "cuda"
    variants = {"one": TrainerStep(run, device, capture=cuda, compile=False),
                "stacked": StackedStep(run, device, seeds)}
    if args.stack_compile and cuda:  # the stacked losses compiled whole (train.compile)
        variants["compiled"] = StackedStep(run, device, seeds, compile=True)
    timings = alternate(variants, args.steps, args.warmup + 3 * ("compiled" in variants), sync=lambda: sync(device))
    row = {"seeds": seeds, **{name: 1000 * timings.median(name) for name in variants}, "timings": timings.as_dict(1000)}
    row["per_run"] = row["stacked"] / seeds
    stacked = StackedStep(run, device, seeds)
    alone = [TrainerStep(run, device, capture=cuda, compile=False, seed=s) for s in range(seeds)]
    worst = 0.0
    for _ in range(10):
        batches = stacked.batches()
        together = stacked(batches)
        for i, (one, batch) in enumerate(zip(alone, batches)):
            own = float(one(batch))
            worst = max(worst, abs(float(together[i]) - own) / max(abs(own), 1e-12))
    row["loss_rel"] = worst
    print(f"  {task}: {seeds} seeds stacked {row['stacked']:.1f} ms/step ({row['per_run']:.1f} per run), one run "
          f"{row['one']:.1f} ms; losses within {worst:.1e} of each run's own", flush=True)
    return row


def busy_share(step, device: torch.device, steps: int = 3) -> tuple[float, float]:
    """(share of the wall time the device computes, kernels per step) over `steps` steps."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync(device)
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kernels) / 1e6  # microseconds
    return busy / wall, len(kernels) / steps


def agreement(run, device: torch.device, steps: int) -> dict:
    """Eager and captured training from one seed on the same batches: the largest relative
    differences of their losses and final weights."""
    eager, captured = TrainerStep(run, device, capture=False, compile=False), TrainerStep(run, device, capture=True,
                                                                                          compile=False)
    batches = [eager.batches() for _ in range(steps)]
    losses = [(float(eager(b)), float(captured(b))) for b in batches]
    worst_loss = max(abs(a - b) / max(abs(a), 1e-12) for a, b in losses)
    worst_weight = max(float((p - q).detach().abs().max() / p.detach().abs().max().clamp(min=1e-12))
                       for p, q in zip(eager.state.model.parameters(), captured.state.model.parameters()))
    return {"steps": steps, "loss_rel": worst_loss, "weight_rel": worst_weight, "first_loss": losses[0][0],
            "last_loss": losses[-1][0], "recorded": captured.recorded}


def looped_rows(task: str, device: torch.device, args) -> dict:
    """The looped step every way, the ways taking turns step by step; each step draws its own batch."""
    run = load(LOOPED[task], device, SMALL)
    cuda, row = device.type == "cuda", {}
    ways = [("eager", False, False)] + ([("captured", True, False)] if cuda else [])
    if not args.no_compile:  # compiled: the blocks eagerly; a recorded step's loss whole (lengthgen.accel.compiling)
        ways += [("compiled", False, True)] + ([("compiled+captured", True, True)] if cuda else [])
    draw = time_one(TrainerStep(run, device, capture=False, compile=False).batches, args.steps)
    row["draw"] = 1000 * draw.median
    print(f"  {task}: drawing a batch on the host {row['draw']:.1f} ms", flush=True)
    steppers = {}
    for name, capture, compiled in ways:
        steppers[name], why = built(lambda: TrainerStep(run, device, capture=capture, compile=compiled))
        if why:
            row[name] = why
            print(f"  {task} {name}: {why}", flush=True)
            del steppers[name]
    # compiling (a block's graphs, a recorded step's loss) happens in the first calls: 3 more
    # untimed rounds keep it out of the compiled ways' samples
    warmup = args.warmup + 3 * (not args.no_compile)
    timings = alternate(steppers, args.steps, warmup, sync=lambda: sync(device), keep_going=True)
    row["timings"] = timings.as_dict(1000)
    for name, stepper in steppers.items():
        if name in timings.failed:
            row[name] = f"failed: {timings.failed[name]}"
            print(f"  {task} {name}: {row[name]}", flush=True)
            continue
        row[name] = 1000 * timings.median(name)
        if name in ("eager", "captured", "compiled+captured") and cuda:
            row[f"{name}_busy"], row[f"{name}_kernels"] = busy_share(stepper, device)
            print(f"  {task} {name}: GPU busy {row[f'{name}_busy']:.0%}, {row[f'{name}_kernels']:.0f} kernels a step",
                  flush=True)
        if stepper.recorded:
            row[f"{name}_graphs"] = stepper.graphs()
        elif "captured" in name:
            row[f"{name}_note"] = "recording failed: the steps ran eagerly (the note above)"
        stats = timings[name]
        print(f"  {task} {name}: {row[name]:.1f} ms/step (quartiles {1000 * stats.q1:.1f}-{1000 * stats.q3:.1f})",
              flush=True)
    if args.authors:
        try:
            row["authors"] = authors_ms(args.authors, task, device, args)
        except Exception as err:
            row["authors"] = failed(err)
        print(f"  {task} authors: {row['authors']}", flush=True)
    return row


def authors_ms(folder: str, task: str, device: torch.device, args) -> float | str:
    """The authors' step on this device (benchmarks/authors/looped_tf.py), in a process of its own:
    it cannot take turns with lengthgen's steps, so it runs after them."""
    from benchmarks.authors.looped_tf import authors_available, authors_step_ms
    path = Path(folder) / "looped-tf"
    why = authors_available(path)
    if why:
        return f"not run: {why}"
    return authors_step_ms(path, task=task, device=device.type, steps=args.steps, warmup=args.warmup,
                           length=new_run_config(LOOPED[task]).task.train_max)


def worker(args) -> None:
    """One of several processes: wait for the go file, then train for --seconds; print steps done.
    Throughput over a fixed window, not a timed step: the processes run at once, not in turns."""
    device = pick_device(args.device)
    run = load(LOOPED["parity"], device, SMALL)
    stepper = TrainerStep(run, device, capture=device.type == "cuda", compile=False, seed=args.worker_seed)
    for _ in range(args.warmup + 2):
        stepper()
    sync(device)
    Path(args.worker_ready).write_text("ready")
    while not Path(args.worker_go).exists():
        time.sleep(0.01)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        stepper()
        steps += 1
        if steps % 10 == 0:
            sync(device)
    sync(device)
    print(json.dumps({"steps_per_s": steps / (time.perf_counter() - start)}))


def several(procs: int, args) -> float:
    """Steps per second of `procs` Parity trainings at once, all of them together."""
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        children = []
        for i in range(procs):
            ready = Path(tmp) / f"ready{i}"
            cmd = [sys.executable, __file__, "--device", args.device, "--worker-seed", str(i), "--worker-ready",
                   str(ready), "--worker-go", str(go), "--seconds", str(args.seconds), "--warmup", str(args.warmup)]
            children.append((ready, subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)))
        while not all(ready.exists() or child.poll() is not None for ready, child in children):
            time.sleep(0.05)
        go.write_text("go")
        rates = [json.loads(child.communicate()[0].strip().splitlines()[-1])["steps_per_s"]
                 for _, child in children]
    return sum(rates)


def content_rows(device: torch.device, args) -> dict:
    """ms per flip-flop step of each scheme, eager and (on CUDA) captured, all taking turns."""
    steppers, row = {}, {}
    for scheme in ("rope", "tra", "cope", "fox"):
        run = load(FLIPFLOP, device, SMALL_FLIPFLOP, [f"model.position={scheme}"]
                   + (["model.position_options={theta = 500000.0}"] if scheme == "rope" else []))
        for capture in (False, True) if device.type == "cuda" else (False,):
            name = f"{scheme}{' captured' if capture else ''}"
            steppers[name], why = built(lambda: TrainerStep(run, device, capture=capture, compile=False))
            if why:
                print(f"  flip-flop {name}: {why}", flush=True)
                del steppers[name]
    timings = alternate(steppers, args.steps, args.warmup, sync=lambda: sync(device), keep_going=True)
    for name, why in timings.failed.items():
        print(f"  flip-flop {name}: failed: {why}", flush=True)
    for name in timings.stats:
        row[name] = 1000 * timings.median(name)
        print(f"  flip-flop {name}: {row[name]:.1f} ms/step", flush=True)
    row["timings"] = timings.as_dict(1000)
    return row


def table(results: dict, device_name: str) -> str:
    lines = [f"device: {device_name}", "", "| looped step, paper preset | " + " | ".join(
        k for k in ("eager", "captured", "compiled", "compiled+captured", "authors")) + " |", "|---" * 6 + "|"]
    for task, row in results["looped"].items():
        cells = [f"{row[k]:.1f} ms" if isinstance(row.get(k), float) else str(row.get(k, "–"))
                 for k in ("eager", "captured", "compiled", "compiled+captured", "authors")]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    for task, row in results["looped"].items():
        for name in ("eager", "captured", "compiled+captured"):
            if f"{name}_busy" in row:
                lines.append(f"{task} {name}: GPU busy {row[f'{name}_busy']:.0%} of the step, "
                             f"{row[f'{name}_kernels']:.0f} kernels a step")
        if "captured_graphs" in row:
            lines.append(f"{task}: {row['captured_graphs']} CUDA graphs recorded")
        for name in ("captured", "compiled", "compiled+captured", "authors"):
            if isinstance(row.get(name), float) and isinstance(row.get("eager"), float):
                lines.append(f"{task}: {name} {row['eager'] / row[name]:.2f}x the speed of eager")
    for task, check in results.get("agreement", {}).items():
        lines.append(f"{task}: eager and captured agree over {check['steps']} steps: losses within "
                     f"{check['loss_rel']:.1e} relative, weights within {check['weight_rel']:.1e}")
    if results.get("several"):
        one = results["several"].get("1")
        for procs, rate in results["several"].items():
            lines.append(f"{procs} Parity run(s) at once: {rate:.0f} steps/s together"
                         + (f", {rate / one:.2f}x one run" if one else ""))
    for task, row in results.get("stacked", {}).items():
        lines.append(f"{task}: {row['seeds']} seeds stacked {row['stacked']:.1f} ms a step, {row['per_run']:.1f} ms "
                     f"per run ({row['one'] / row['per_run']:.2f}x one run's {row['one']:.1f} ms); each seed's losses "
                     f"within {row['loss_rel']:.1e} of its own run's"
                     + (f"; compiled whole {row['compiled'] / row['seeds']:.1f} ms per run"
                        if "compiled" in row else ""))
    content = {k: v for k, v in results.get("content", {}).items() if k != "timings"}
    for name, ms in content.items():
        base = content.get("rope captured" if name.endswith("captured") else "rope")
        lines.append(f"flip-flop {name}: {ms:.1f} ms/step" + (f", {ms / base:.2f}x RoPE" if base else ""))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (graphs are recorded here)")
    p.add_argument("--tasks", default="parity,addition")
    p.add_argument("--procs", default="1,4", help="process counts for several runs per GPU ('' skips)")
    p.add_argument("--seconds", type=float, default=8.0, help="how long each of several processes trains")
    p.add_argument("--stack", type=int, default=3, help="seeds trained stacked (0 skips)")
    p.add_argument("--stack-compile", action="store_true", help="also the stacked step compiled whole (CUDA)")
    p.add_argument("--authors", help="folder holding looped-tf (benchmarks/authors/looped_tf.py)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled variants")
    p.add_argument("--no-content", action="store_true", help="skip TRA, CoPE and FoX against RoPE")
    p.add_argument("--worker-seed", type=int, help=argparse.SUPPRESS)
    p.add_argument("--worker-ready", help=argparse.SUPPRESS)
    p.add_argument("--worker-go", help=argparse.SUPPRESS)
    records.add_arguments(p)
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.worker_ready:
        worker(args)
        return
    device = pick_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    started = time.perf_counter()
    results = {"device": name, "looped": {}, "agreement": {}}
    tasks = [t for t in args.tasks.split(",") if t]
    for task in tasks:
        results["looped"][task] = looped_rows(task, device, args)
    if device.type == "cuda":
        for task in tasks:
            try:
                results["agreement"][task] = agreement(load(LOOPED[task], device, SMALL), device, 20)
                print(f"  agreement {task}: {results['agreement'][task]}", flush=True)
            except Exception as err:
                print(f"  agreement {task}: {failed(err)}", flush=True)
    results["stacked"] = {}
    for task in tasks if args.stack > 0 else []:
        try:
            results["stacked"][task] = stacked_rows(task, device, args.stack, args)
        except Exception as err:
            print(f"  {task} stacked: {failed(err)}", flush=True)
    results["several"] = {}
    for procs in [p_ for p_ in args.procs.split(",") if p_]:
        try:
            results["several"][procs] = several(int(procs), args)
            print(f"  {procs} processes: {results['several'][procs]:.1f} steps/s together", flush=True)
        except Exception as err:
            print(f"  {procs} processes: {failed(err)}", flush=True)
    if not args.no_content:
        results["content"] = content_rows(device, args)
    results["seconds"] = time.perf_counter() - started
    print(table(results, name))
    print(f"benchmark took {results['seconds']:.0f} s")
    records.write(__file__, args, results, device=str(device))


if __name__ == "__main__":
    main()
