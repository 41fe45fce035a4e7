"""Getting a run ready: a config (a preset with its --set overrides, or a saved run's) checked once
against every registry, and its parts built once (the task, the method, the positional scheme and the
position transform), as a `Run`.

    runs.py     `Run`, and the two ways to get one: `new_run(preset, overrides)` and `saved_run(folder)`
    checks.py   the checks of a config against the registries, each part built on the way

This file re-exports nothing, so each name has one import path (`from lengthgen.assembly.runs import
new_run`), and importing the package alone loads no registry.
"""
