"""`lengthgen tasks|train|eval|report|reproduce|export`.

Bad input (unknown key, wrong type, impossible value, missing file, corrupt
checkpoint, existing run folder) is one line on stderr and exit code 2,
before anything is written.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from pathlib import Path

from lengthgen.errors import ResourceError, RunsFailed, TrainingDiverged, UserError


def cmd_tasks(args) -> None:
    import torch

    from lengthgen.config.schema import MAX_LENGTH, MAX_SEED
    from lengthgen.tasks import TASKS, get_task

    if not 1 <= args.length <= MAX_LENGTH:  # the problem lengths a config may train or test
        raise UserError(f"--length must be in [1, {MAX_LENGTH:,}], got {args.length}")
    if not 0 <= args.seed < MAX_SEED:  # torch takes 64-bit seeds
        raise UserError(f"--seed must be in [0, 2**63), got {args.seed}")
    for name in TASKS:
        task = get_task(name)
        try:
            batch = task.sample(1, args.length, torch.Generator().manual_seed(args.seed))
        except ValueError as err:  # a corpus not on this machine (CorpusError), a length the task cannot take
            print(f"{name:<15} (no example: {err})")
            continue
        question, answer = task.to_text(batch, 0)
        steps = int(batch.n_steps[0])
        print(f"{name:<15} {question} -> {answer}   (n={args.length}, T(n)={steps}, vocab {task.vocab_size})")


def cmd_corpus(args) -> None:
    from lengthgen.runtime.resources import DISK_FULL, NOT_WRITABLE, os_error_line
    from lengthgen.tasks.corpus import Corpus

    try:
        corpus = Corpus(args.source, args.path or "", args.tokenizer, args.vocab_size, args.max_documents)
        meta = corpus.meta()  # builds the token files on first use
    except ValueError as err:  # CorpusError too: says how to get the corpus
        raise UserError(str(err)) from None
    except OSError as err:  # the cache has no --out: its folder is $LENGTHGEN_DATA
        if err.errno not in DISK_FULL | NOT_WRITABLE:
            raise
        raise ResourceError(os_error_line(err, "$LENGTHGEN_DATA")) from None
    where = corpus.folder() if args.source in ("python-docs", "files") else args.path or "hub"
    print(f"corpus {args.source} ({where}), "
          f"tokenizer {args.tokenizer}, vocabulary {meta['vocab_size']}: {corpus.tokens_folder()}")
    for split, info in meta["splits"].items():
        print(f"  {split:<10} {info['documents']:>7} documents {info['characters']:>12,} characters "
              f"{info['tokens']:>12,} tokens")


def cmd_train(args) -> None:
    from lengthgen import api
    from lengthgen.training.distributed import Ranks

    main_process = Ranks.from_env().main  # under torchrun, one process speaks for the run
    if args.resume and args.preset is not None:
        raise UserError(f"a preset ({args.preset}) cannot change a run being resumed; its saved config is used: "
                        "lengthgen train --resume --out RUN_DIR")
    if args.resume and args.out is None:
        raise UserError("--resume needs the run folder: lengthgen train --resume --out RUN_DIR")
    if args.resume and args.set:
        raise UserError("--set cannot change a run being resumed; its saved config is used")
    if args.defaults and args.preset is not None:
        raise UserError(f"--defaults trains the schema's defaults; it takes no preset ({args.preset})")
    out = args.out
    if out is None and (args.preset or args.defaults):  # the folder is said before training starts
        from lengthgen.config.schema import read
        out = api.default_folder(args.preset, read(args.preset, args.set).train.model_seed)
    if main_process and out is not None:
        print(f"run folder: {out}")
    run = api.train(args.preset, args.set, out=out, resume=args.resume, force=args.force,
                    progress=not args.no_progress, plugins=args.plugin, defaults=args.defaults)
    if main_process:
        print(f"finished at step {run.summary['step']} on {run.summary['device']}; evaluate with: lengthgen eval {out}")


def cmd_eval(args) -> None:
    from lengthgen import api
    from lengthgen.config.schema import parse_sweep
    from lengthgen.results.rows import COLUMNS, format_table, is_label, metric_names

    sweep = None
    if args.sweep:
        sweep = {}
        for text in args.sweep:
            if "=" not in text:  # parse_override's message would name --set
                raise UserError(f"--sweep expects OPTION=[VALUES], e.g. --sweep 'symbols=[5, 10]', got {text!r}")
            key, values = parse_sweep(text)
            sweep[key] = values
    rows = api.evaluate(args.run, args.lengths, args.samples, stops=args.stop.split(",") if args.stop else None,
                        batch_size=args.batch_size, seed=args.seed, per_step=args.per_step, sweep=sweep,
                        position_draws=args.position_draws, compile=True if args.compile else None, out=args.out,
                        progress=not args.no_progress)
    swept = [k for k in rows[0] if k not in COLUMNS and not is_label(k) and k not in metric_names(rows[0])]
    group = lambda r: (r["stop"], *(r[k] for k in swept))  # noqa: E731
    for key in dict.fromkeys(map(group, rows)):  # one table per rule (and swept values), in the order given
        if swept:
            print(", ".join(f"{k} = {v}" for k, v in zip(swept, key[1:])))
        print(format_table([r for r in rows if group(r) == key]))
    out = Path(args.out or args.run)
    print(f"wrote {out / 'eval.csv'}" + (f" and {out / 'per_step.csv'}" if args.per_step else ""))
    if (out / "token_eval.json").is_file() and (out / "token_loss.csv").is_file():  # per token (docs/lm.md)
        print(f"per-token losses in {out / 'token_loss.csv'}" + (f", dependence sparsity in {out / 'dependence.csv'}"
                                                                 if (out / "dependence.csv").is_file() else "")
              + f", their cost in {out / 'token_eval.json'}")


def cmd_report(args) -> None:
    from lengthgen import api

    report = api.report(args.dirs, args.out, heatmaps=args.heatmap, curves=args.curves,
                        gain_reference=args.gain_reference, across_tasks=args.across_tasks, compare=args.compare,
                        threshold=args.threshold)
    print(report.text)
    print(f"wrote {report.path}, {report.folder / 'results.csv'} and the figures beside them")


def cmd_reproduce(args) -> None:
    from lengthgen.reproduction.grid import describe

    if args.list:
        print(describe(), end="")
        return
    if not args.paper:
        raise UserError("name a paper to reproduce (lengthgen reproduce --list names them)")
    if args.arms is not None and args.methods is not None:
        raise UserError("--methods is another name for --arms; give one of them")
    check_reproduce_flags(args)
    axes = {}
    for text in args.axis:  # KEY=V1,V2: the values as a folder name spells them
        key, _, values = text.partition("=")
        if not key.strip() or not _:
            raise UserError(f"--axis expects KEY=VALUE[,VALUE...], e.g. --axis model.position=rope,xpos, got {text!r}")
        axes[key.strip()] = [v.strip() for v in values.split(",") if v.strip()]
    from lengthgen import api  # (--list and a refused flag do without it)
    try:
        report = api.reproduce(args.paper, tasks=args.tasks, arms=args.arms if args.methods is None else args.methods,
                               seeds=args.seeds, scale=args.scale, out=args.out, workers=args.workers,
                               threads=args.threads, samples=args.samples, overrides=args.set, axes=axes,
                               plugins=args.plugin, progress=not args.no_progress, stack_seeds=args.stack_seeds,
                               backend=args.backend, address=args.address, gpus_per_job=args.gpus_per_job)
    except RunsFailed as err:  # the others' report first, then the one line that says the grid is incomplete
        if err.report is not None:
            print(err.report.read_text())
        raise
    print(report.text)
    print(f"wrote {report.path} (with results.csv and figures beside it)")


def check_reproduce_flags(args) -> None:
    """Flags refused in one line before a grid is read: counts outside their ranges, options of the
    other backend, --set keys that reproduce sets per run; with --backend ray, Ray installed and its
    address checked for its form and reached (with a timeout) before any run starts."""
    import math

    from lengthgen.config.schema import MAX_SEEDS, MAX_THREADS, PER_RUN_KEYS, flat, parse_override

    if args.seeds is not None and args.seeds > MAX_SEEDS:
        raise UserError(f"--seeds must be in [1, {MAX_SEEDS:,}], got {args.seeds}")
    if args.threads > MAX_THREADS:  # each run's train.threads, which its saved config must keep
        raise UserError(f"--threads must be in [0, {MAX_THREADS}] (train.threads), got {args.threads}")
    workers = args.workers if args.workers is not None else 1  # None: chosen by device (reproduce.runner)
    if (args.seeds is not None and args.seeds < 1) or workers < 1 or args.threads < 0:
        raise UserError("--seeds and --workers must be >= 1, --threads >= 0")
    if args.gpus_per_job is not None and not (math.isfinite(args.gpus_per_job) and args.gpus_per_job >= 0):
        raise UserError(f"--gpus-per-job must be a finite number >= 0, got {args.gpus_per_job}")
    if args.backend != "ray" and (args.address is not None or args.gpus_per_job is not None):
        raise UserError("--address and --gpus-per-job are options of --backend ray")
    if args.backend == "ray" and args.stack_seeds:
        raise UserError("--stack-seeds is an option of the local backend (Ray runs each seed as a task of its own)")
    if args.samples < 0:
        raise UserError(f"--samples must be >= 1 (or 0 for the presets' own), got {args.samples}")
    if args.samples > 0:  # each run's evaluation holds a length's test set whole: refused before any run trains
        from lengthgen.runtime.resources import check_samples
        check_samples(args.samples, "--samples")
    for setting in args.set:  # flattened, so an inline table (train={threads=1}) is caught too
        for key in flat(parse_override(setting)):
            if key in PER_RUN_KEYS:
                raise UserError(f"--set {key} is set per run by reproduce; use {PER_RUN_KEYS[key]} instead")
    if args.backend == "ray":  # last: reaching a cluster may take seconds
        from lengthgen.reproduction.ray_runner import check_address, require
        if args.address is not None:
            check_address(args.address)
        require()  # a one-line error naming the extra, before anything is planned or written


def parser() -> argparse.ArgumentParser:
    from lengthgen import __version__

    p = argparse.ArgumentParser(prog="lengthgen", description="Train on short inputs, test on long ones.")
    p.add_argument("--version", action="version", version=f"lengthgen {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (add_setup_commands, add_eval_command, add_report_command, add_reproduce_command, add_export_command):
        add(sub)
    for command in sub.choices.values():  # every command imports the user's plugins before it assembles anything
        command.add_argument("--plugin", action="append", default=[], metavar="MODULE_OR_FILE",
                             help="import a plugin first: a module (my_pkg.schemes) or a .py file that registers "
                                  "schemes, tasks, methods, stop rules or transforms (docs/api.md); repeatable; "
                                  "recorded in the runs it trains")
    return p


def add_export_command(sub) -> None:
    x = sub.add_parser("export", help="a finished run as a Hugging Face folder (docs/export.md)")
    x.add_argument("run", help="run folder")
    x.add_argument("--out", required=True, help="the folder to write (new, or an earlier export with --force)")
    x.add_argument("--force", action="store_true", help="replace an earlier export in --out (it deletes only the "
                   "files that export wrote: a folder holding anything else, eval.csv included, is refused)")
    x.set_defaults(func=cmd_export)


def cmd_export(args) -> None:
    from lengthgen import api

    notes = api.export(args.run, args.out, force=args.force)
    for note in notes:  # what the Hugging Face side cannot express, one line each
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {args.out}: load it with AutoModelForCausalLM.from_pretrained({str(args.out)!r}, trust_remote_code=True)")


def cmd_presets(args) -> None:
    from lengthgen import api

    chosen = [p for p in api.presets() if args.paper in (None, p.paper)]
    if not chosen:
        papers = sorted({p.paper for p in api.presets()})
        raise UserError(f"no bundled presets of {args.paper!r}; papers: {', '.join(papers)}")
    width = max(len(p.name) for p in chosen)
    print(f"{'preset':<{width}}  {'paper':<12} {'scale':<6} task")
    for p in chosen:
        print(f"{p.name:<{width}}  {p.paper:<12} {p.scale or '-':<6} {p.task}")
    print(f"{len(chosen)} presets; train one with: lengthgen train {chosen[0].name}")


def add_setup_commands(sub) -> None:
    """tasks, corpus and train."""
    t = sub.add_parser("tasks", help="list the tasks with a rendered example")
    t.add_argument("--length", type=int, default=6, help="problem length of the examples")
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=cmd_tasks)

    c = sub.add_parser("corpus", help="tokenize a language-modelling corpus once and print its splits")
    c.add_argument("--source", default="python-docs", help="python-docs (default), files, wikitext-103 or c4")
    c.add_argument("--path", help="a local copy of the corpus (a folder)")
    c.add_argument("--tokenizer", default="bytes", help="bytes (default) or bpe")
    c.add_argument("--vocab-size", type=int, default=0, help="BPE vocabulary size")
    c.add_argument("--max-documents", type=int, default=0, help="at most this many documents per split (0 = all)")
    c.set_defaults(func=cmd_corpus)
    ps = sub.add_parser("presets", help="list the bundled presets (paper, scale, task) that train takes by name")
    ps.add_argument("paper", nargs="?", help="only this paper's presets (e.g. looped)")
    ps.set_defaults(func=cmd_presets)
    tr = sub.add_parser("train", help="train one run")
    tr.add_argument("preset", nargs="?", help="a bundled preset's name (looped/cpu/parity; `lengthgen presets` "
                    "lists them) or a TOML file, e.g. experiments/core/parity-ntp.toml")
    tr.add_argument("--defaults", action="store_true", help="train the schema's defaults, with no preset")
    tr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. model.n_layer=3")
    tr.add_argument("--out", help="run folder (default runs/<preset>-s<seed>)")
    tr.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint "
                    "(one stopped before its first checkpoint starts again from step 0 with its saved config)")
    tr.add_argument("--force", action="store_true", help="delete and replace an existing run folder (only a "
                    "lengthgen run: a folder holding other files, or the current folder, is refused)")
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.set_defaults(func=cmd_train)


def add_eval_command(sub) -> None:
    e = sub.add_parser("eval", help="accuracy vs length of a trained run -> RUN/eval.csv")
    e.add_argument("run", help="run folder, or a folder of `lengthgen export`")
    e.add_argument("--lengths", help="e.g. 1:40, 10:50:10 or 8,16,32 (default: the run's eval.lengths)")
    e.add_argument("--samples", type=int, default=None,
                   help="test samples per length (default: the run's eval.samples; test tokens for the text task)")
    e.add_argument("--batch-size", type=int, default=None)
    e.add_argument("--seed", type=int, default=None, help="evaluation seed (default: the run's eval.seed)")
    e.add_argument("--stop", help="looped methods: oracle (default), fixed:N, confidence[:T_MAX], "
                   "confidence-per-sample[:T_MAX[:PATIENCE]], first-confident[:T_MAX], halt[:T_MAX] (looped-halt, "
                   "looped-halt-probe and looped-clock runs); T_MAX may be +N (T(n) + N); several, comma-separated, share one pass")
    e.add_argument("--sweep", action="append", metavar="OPTION=[VALUES]",
                   help="evaluate every value of a task option, e.g. --sweep 'symbols=[5, 10]', or a rotary run "
                        "with RoPE stretched at test time: --sweep 'position.scaling=[none,pi,ntk,yarn]' "
                        "(position.factor=[dynamic] by default, or numbers >= 1) (default: the run's eval.sweep); "
                        "rows carry a column per option")
    e.add_argument("--per-step", action="store_true",
                   help="looped methods: also record accuracy and confidence after every iteration -> per_step.csv")
    e.add_argument("--position-draws", type=int, default=None,
                   help="runs trained with randomized position IDs: read each test sample under N draws of "
                        "its IDs and average (default: the run's eval.position_draws)")
    e.add_argument("--compile", action="store_true", help="torch.compile each block (as eval.compile; "
                   "pays on long evaluations, docs/benchmarks.md)")
    e.add_argument("--out", help="write eval.csv (with a copy of the run's config.toml) into this folder "
                   "instead of the run's, e.g. for a run on a shared filesystem one cannot write")
    e.add_argument("--no-progress", action="store_true")
    e.set_defaults(func=cmd_eval)


def add_report_command(sub) -> None:
    r = sub.add_parser("report", help="tables and a figure from eval.csv files")
    r.add_argument("dirs", nargs="+", help="run folders or folders containing runs")
    r.add_argument("--out", help="where to write report.md, results.csv and the figure "
                   "(default: the first DIR, or the folder of a CSV file given first)")
    r.add_argument("--heatmap", action="append", default=[], metavar="COLUMN",
                   help="also draw accuracy over length x COLUMN (a task option swept in evaluation)")
    r.add_argument("--curves", action="store_true",
                   help="also draw training curves: the loss and, for runs that tested during training "
                        "(tests.interval), exact match against step")
    r.add_argument("--gain-reference", metavar="ARM_OR_RUN",
                   help="also compare every run's per-token losses with the reference runs of this arm (or this "
                        "run folder), paired by seed: G/Δ by dependence sparsity k (docs/sparsity.md)")
    r.add_argument("--across-tasks", metavar="COLUMNS",
                   help="also draw accuracy at 2x the training length for each row of these columns (comma list, "
                        "e.g. arm,position) on every task, ranked by mean reciprocal rank across tasks (docs/matrix.md)")
    r.add_argument("--compare", metavar="ARM_A,ARM_B",
                   help="also test the difference between two arms (or methods outside a grid) task by task: "
                        "Welch's t-test on the seeds' scores, with its p-value (docs/statistics.md)")
    r.add_argument("--threshold", type=float, metavar="X",
                   help="the score a seed must reach to count as a success, and the mean accuracy every length up "
                        "to the effective length must reach (default 0.9)")
    r.set_defaults(func=cmd_report)


def add_reproduce_command(sub) -> None:
    rp = sub.add_parser("reproduce", help="train, evaluate and report a paper's comparison")
    rp.add_argument("paper", nargs="?", help="a folder name under experiments/ (see --list) or a folder holding a grid.toml")
    rp.add_argument("--list", action="store_true", help="name every paper with its scales, tasks and arms")
    rp.add_argument("--scale", help="cpu (minutes on 2 cores; the default) or paper (published hyperparameters)")
    rp.add_argument("--seeds", type=int, help="seeds per run (default: the grid's)")
    rp.add_argument("--tasks", help="comma list (default: the grid's default tasks)")
    rp.add_argument("--arms", help="comma list (default: the grid's default arms)")
    rp.add_argument("--methods", help="another name for --arms")
    rp.add_argument("--out", help="output folder (default runs/reproduce-<paper>-<scale>)")
    rp.add_argument("--workers", type=int, default=None,
                    help="runs trained in parallel (local backend; default where runs train on CUDA: 1 per GPU, "
                         "4 where steps run eagerly; else 2; docs/cluster.md)")
    rp.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="local: a pool of --workers processes; ray: a Ray task per run (docs/cluster.md)")
    rp.add_argument("--address", help="--backend ray: the cluster to join, e.g. auto or ray://HEAD:10001 "
                    "(default: start a local Ray instance)")
    rp.add_argument("--gpus-per-job", type=float, default=None,
                    help="--backend ray: GPUs a run on CUDA asks for (default 1; 0.5 puts two runs on a GPU)")
    rp.add_argument("--stack-seeds", action="store_true",
                    help="train each configuration's seeds as one stacked model in one worker (methods whose "
                         "steps can be recorded; same numbers; for GPUs, docs/cluster.md)")
    rp.add_argument("--threads", type=int, default=0,
                    help="torch threads per run, and the CPUs a CPU run asks Ray for "
                         "(default: the machine's cores shared among the workers)")
    rp.add_argument("--axis", action="append", default=[], metavar="KEY=VALUES",
                    help="run only some values of one of the grid's axes, e.g. --axis model.position=rope,xpos "
                         "(repeatable; default: every value)")
    rp.add_argument("--samples", type=int, default=0, help="test samples per length (default: the presets')")
    rp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override for every run, e.g. train.precision=bf16 (repeatable)")
    rp.add_argument("--no-progress", action="store_true")
    rp.set_defaults(func=cmd_reproduce)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from lengthgen.plugins import load as load_plugins
        load_plugins(args.plugin)  # before any command reads a registry: `lengthgen tasks --plugin x.py` lists its tasks
        args.func(args)
        sys.stdout.flush()  # here, where a reader gone (a broken pipe) is caught, not at exit
    except (UserError, TrainingDiverged, ResourceError, RunsFailed) as err:
        print(f"lengthgen: error: {err}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:  # `lengthgen report RUNS | head`: the reader has what it wanted; silent, as ls is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not fail again
        return 128 + signal.SIGPIPE
    except OSError as err:  # a folder it cannot write, a full disk: the path and what to do
        from lengthgen.runtime.resources import os_error_line
        print(f"lengthgen: error: {os_error_line(err)}", file=sys.stderr)
        return 1
    except (MemoryError, RuntimeError) as err:
        from lengthgen.runtime.resources import is_out_of_memory, oom_detail
        if not is_out_of_memory(err):
            raise
        print(f"lengthgen: error: out of memory ({oom_detail(err)}): lower the batch size "
              "(train.batch_size, eval --batch-size) or the model's size, or free memory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("lengthgen: interrupted (a training run continues with --resume, a reproduction when run again)",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
