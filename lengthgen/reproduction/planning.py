"""A grid at one scale turned into a reproduction's jobs (lengthgen.reproduction.grid reads and checks
the grid): each run's overrides and validated config, worked out once in the parent process, and the
labels that tell its runs apart in the report."""
from __future__ import annotations

import copy
import os
from pathlib import Path

from lengthgen.assembly.runs import new_run
from lengthgen.config.schema import PER_RUN_KEYS, RUNTIME_KEYS, flat, option_combinations, to_dict
from lengthgen.errors import UserError
from lengthgen.methods.looped.stop_rules import parse_rule
from lengthgen.reproduction.axes import axis_name, cut_axes
from lengthgen.reproduction.grid import AtScale, Grid, Job
from lengthgen.reproduction.request import ReproduceRequest
from lengthgen.results.rows import cell

# config keys every eval.csv row names in a column of its own: not repeated as labels
OWN_COLUMNS = {"method", "task.name", "model.position"}


def labels_of(at: AtScale, tasks: list[str], arms: list[str], extra: list[str]) -> tuple[dict, dict]:
    """{(task, arm, axis values): labels}: the config keys whose values differ between the runs
    the report puts in one table, those of every grid entry whose preset names the same registry
    task, over every arm and axis value the grid declares (not only those run now, so a run's
    labels do not depend on which others were asked for), with the --set `extra` that every run
    gets. An arm not run now that `extra` does not suit (an option of another scheme, say) is
    left out rather than refused. Every config is loaded (validated) once, whatever the number of
    tasks; each run's overrides and assembled run are returned beside the labels, for its jobs to carry."""
    configs, loaded = {}, {}
    for entry in at.data["tasks"]:
        preset = at.preset(entry)
        for arm in at.arms_of(entry):
            for values in option_combinations(at.axes(entry)):
                try:
                    sets = at.overrides(entry, arm, values) + list(extra)
                    run = new_run(preset, sets)
                except UserError:
                    if entry in tasks and arm in arms:
                        raise
                    continue
                # an empty options table is no setting: {} and a missing key must not count as a difference
                configs[(entry, arm, tuple(values.items()))] = {k: v for k, v in flat(to_dict(run.cfg)).items() if v != {}}
                loaded[(entry, arm, tuple(values.items()))] = sets, run
    labels = {}
    for name in {c["task.name"] for c in configs.values()}:
        table = {run: c for run, c in configs.items() if c["task.name"] == name}
        keys = sorted({k for c in table.values() for k in c})
        differ = [k for k in keys if k not in OWN_COLUMNS | RUNTIME_KEYS | set(PER_RUN_KEYS)
                  and len({repr(c.get(k)) for c in table.values()}) > 1]
        labels.update({run: {"arm": run[1], **{k: c.get(k, "") for k in differ}} for run, c in table.items()})
    return labels, loaded


def plan(grid: Grid, request: ReproduceRequest) -> list[Job]:
    """The jobs of a reproduction: `request`'s tasks and arms at its scale, `request.seeds` runs each
    in request.out/runs (given: lengthgen.reproduction.runner.planned fills in their defaults).
    `threads`: torch threads per run; 0 shares the machine's cores among the `workers` (None: one).
    `axes` ({key: [values]}, --axis): run only these values of an axis, which may add values the grid
    does not declare (a plugin's scheme beside the grid's). `overrides`: every run's, after its arm's.
    `plugins`: loaded by the caller, recorded in every run's config after its preset's own. Every
    config is loaded (validated) here, in the parent process, once per task, arm and axis values, with
    its overrides; each job carries both, seeds and threads set, so no worker loads it again."""
    tasks, arms, out, plugins = list(request.tasks), list(request.arms), Path(request.out), request.plugins
    at = grid.at(request.scale).with_values(tasks, request.axes)
    chosen_axes = cut_axes(at, tasks, request.axes)
    threads = request.threads or max(1, (os.cpu_count() or 1) // (request.workers or 1))
    jobs, (labels, loaded) = [], labels_of(at, tasks, arms, list(request.overrides))
    for task in tasks:
        preset = at.preset(task)
        for arm in (a for a in arms if a in at.arms_of(task)):
            spec = at.arm(task, arm)
            stops, per_step = [str(parse_stop(grid, arm, s)) for s in spec.get("stops", [])], spec.get("per_step", False)
            for values in option_combinations(chosen_axes[task]):
                sets, run = loaded[(task, arm, tuple(values.items()))]
                cfg, method = run.cfg, run.method
                grid.fail_unless(method.has_stop_rules or not (stops or per_step),
                                 f"arm {arm} lists stop rules or per_step, but its method {method.name} has no stop rules")
                for stop in stops:
                    parse_stop(grid, arm, stop, method)
                name = "-".join([task, arm, *(f"{axis_name(k)}={cell(v)}" for k, v in values.items())])
                sweep = at.evaluation_sweep(run)
                for seed in range(request.seeds):
                    seeded = copy.deepcopy(cfg)
                    seeded.train.model_seed = seeded.data.seed = seed
                    seeded.train.threads = threads
                    seeded.plugins = list(dict.fromkeys(seeded.plugins + list(plugins)))
                    jobs.append(Job(task, arm, seed, str(preset),
                                    sets + [f"train.model_seed={seed}", f"data.seed={seed}", f"train.threads={threads}"],
                                    str(out / "runs" / f"{name}-s{seed}"), stops, per_step, request.samples, threads,
                                    labels[(task, arm, tuple(values.items()))], config=to_dict(seeded), sweep=sweep))
    return jobs


def parse_stop(grid: Grid, arm: str, text, method=None) -> object:
    """The stop rule `text` of an arm; checked against the arm's method when one is given."""
    try:
        rule = parse_rule(text)
        return rule.check(method) if method is not None else rule
    except ValueError as err:
        raise UserError(f"{grid.path} arms.{arm}.stops: {err}") from None
