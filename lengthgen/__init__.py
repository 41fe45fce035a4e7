"""lengthgen: train small transformers on short inputs, test them on long ones.

    import lengthgen
    run = lengthgen.train("looped/cpu/parity", {"train.steps": 300}, out="runs/p")
    rows = run.evaluate(lengths=range(1, 25), stops=["oracle"])

The functions (lengthgen.api), the registries' decorators (`lengthgen.register.scheme`, `.task`,
`.method`, `.stop_rule`, `.transform`), the base classes to subclass and the errors are imported
when first used, so `import lengthgen` (and the CLI's start) loads no torch. docs/api.md.
"""
import os

# OpenMP threads that spin while they wait hold a core that another job needs: on a 2-core machine
# running one other CPU-bound job, a run with 2 spinning torch threads took 6-8 s per step where
# 1 thread took 0.7 s, and 2 threads that sleep while they wait 0.4 s (benchmarks/decisions/threads.py).
# The policy is read once, when torch loads OpenMP, so it is set here, before any torch import;
# a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

# name -> the module that defines it
_EXPORTS = {
    # (export is run.export(out), or lengthgen.api.export: lengthgen.export is the package that writes exports)
    **dict.fromkeys(["train", "load", "evaluate", "reproduce", "report", "load_config", "presets", "papers",
                     "TrainedRun", "Report"], "lengthgen.api"),
    **dict.fromkeys(["UserError", "ConfigError", "PluginError", "ResourceError", "TrainingDiverged", "RunsFailed"],
                    "lengthgen.errors"),
    "Config": "lengthgen.config.schema",
    "EvalSettings": "lengthgen.evaluation.settings",  # the options of evaluate, as one object
    "ReproduceRequest": "lengthgen.reproduction.request",  # the options of reproduce, as one object
    "PositionalScheme": "lengthgen.model.scheme_base",
    "Task": "lengthgen.tasks.base",
    "Batch": "lengthgen.tasks.base",
    "Method": "lengthgen.methods.base",
    "StopRule": "lengthgen.methods.looped.stop_rules",
    "PositionTransform": "lengthgen.model.position_transforms",
}
__all__ = ["__version__", "register", *_EXPORTS]


def __getattr__(name: str):
    """The public names, imported on first use (PEP 562)."""
    import importlib

    if name == "register":
        return importlib.import_module("lengthgen.register")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # asked once
        return value
    raise AttributeError(f"module 'lengthgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
