"""The package's shape (docs/architecture.md): subpackages in the order data flows through them,
each importing only its own layer and those below; no import cycle; and the code that runs
configs, grids and reports names no paper, task or method. Each rule is also shown failing on a
planted violation."""
from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lengthgen.config.schema import Config
from lengthgen.methods.registry import METHODS
from lengthgen.model.position_transforms import TRANSFORMS
from lengthgen.model.positions import SCHEMES
from lengthgen.reproduction import grid as grids
from lengthgen.tasks import TASKS

PACKAGE = Path(__file__).resolve().parents[1] / "lengthgen"
# bottom to top; a module belongs to the first prefix it starts with
LAYERS = [
    ["lengthgen.errors", "lengthgen.register", "lengthgen.plugins"],  # the registries (filled from above) and plugins
    ["lengthgen.config"],  # plain data: the keys, their types and defaults, each section's own checks; schedules of the step
    ["lengthgen.results"],  # plain files: evaluation rows, the training log, per-token files
    ["lengthgen.tasks"],
    ["lengthgen.model"],
    ["lengthgen.methods"],
    ["lengthgen.runtime"],
    ["lengthgen.accel"],  # fast paths over the model's math; below them, nothing imports them (the accel rule)
    ["lengthgen.assembly"],  # a run assembled: its config checked against every registry once, its parts built once
    ["lengthgen.training"],  # its hooks (tests during training) are handed in by its caller
    ["lengthgen.evaluation"],
    ["lengthgen.export"],  # a finished run as a Hugging Face folder; reading one back is runtime's (exported.py)
    ["lengthgen.reporting"],
    ["lengthgen.reproduction"],
    ["lengthgen.api"],  # what the commands do, as functions: the CLI is a thin layer over it
    ["lengthgen.cli", "lengthgen.__main__"],
]
# what a report may load: no model code (no torch), so reading results stays fast and light
REPORTING_READS = ("lengthgen.errors", "lengthgen.config.schema", "lengthgen.config.upgrade", "lengthgen.results",
                   "lengthgen.runtime.run_folders", "lengthgen.reporting",
                   "lengthgen.config.presets", "lengthgen.plugins")  # the schema's: a folder's path, a plugin's path
# the two drawings made from a checkpoint or a corpus, which load what they need when drawn
DRAWN_FROM_A_RUN = {("figures.py", "plot_attention"), ("gain.py", "example_tokens")}
# the evaluator asks a method for its read-out (Method.stops, Method.read_out): only methods/ knows the looped family
LOOPED = "lengthgen.methods.looped"
NO_NAMES = ["results/rows.py", "reproduction/grid.py", "reproduction/runner.py", "reproduction/jobs.py",
            "evaluation/evaluate.py", "reporting/series.py", "reporting/figures.py", "reporting/report.py",
            "training/trainer.py", "config/checks.py", "assembly/runs.py", "assembly/checks.py", "cli.py", "api.py",
            "register.py", "plugins.py"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_only: bool = False) -> set[str]:
    """Every lengthgen module `path` imports, at the top or inside a function (or at the top only)."""
    package = module_name(path).split(".") if path.name == "__init__.py" else module_name(path).split(".")[:-1]
    tree = ast.parse(path.read_text())
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in ast.walk(f)} if top_only else set()
    found = set()
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            if not target.startswith("lengthgen"):
                continue
            for alias in node.names:  # `from lengthgen.runtime import checkpoint` imports a module
                sub = f"{target}.{alias.name}"
                found.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() else target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("lengthgen")}
    return found


def the_graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int | None:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a module in a higher layer; package __init__ files that import nothing stand apart."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target in graph and not graph[target] and (PACKAGE.parent / target.replace(".", "/")).is_dir():
                continue  # a package's docstring-only __init__
            if layer(target) is not None and layer(module) is not None and layer(target) > layer(module):
                found.append(f"{module} imports {target}, a layer above it")
    return found


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1  # on the current path
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def names_in(source: str, variants: bool = False) -> set[str]:
    """Task, method and paper names (and with `variants`, scheme and transform names) written as
    strings outside docstrings."""
    tree = ast.parse(source)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings} & (set(TASKS) | set(METHODS) | set(grids.papers())
                                            | (set(SCHEMES) | set(TRANSFORMS) if variants else set()))


def top_level_imports(path: Path) -> set[str]:
    """The lengthgen modules `path` imports when it is imported (not inside a function)."""
    return imports(path, top_only=True)


def lazy_imports(source: str) -> dict[str, set[str]]:
    """{function: the lengthgen modules it imports when called}."""
    found = {}
    for f in ast.walk(ast.parse(source)):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = {n.module for n in ast.walk(f) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("lengthgen")}
            if names:
                found[f.name] = names
    return found


def loads_model_code_when_called(sources: dict[str, str]) -> set[tuple[str, str]]:
    """(file, function) of the reporting functions that import beyond the results when called."""
    return {(name, f) for name, source in sources.items() for f, targets in lazy_imports(source).items()
            if any(not t.startswith(REPORTING_READS) for t in targets)}


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module importing `start` loads, itself included."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    return seen


def reporting_loads_beyond_results(graph: dict[str, set[str]]) -> list[str]:
    found = set()
    for module in (m for m in graph if m.startswith("lengthgen.reporting")):
        found |= {m for m in reached(graph, module) if m != "lengthgen" and not m.startswith(REPORTING_READS)}
    return sorted(found)


def test_every_module_is_in_a_layer():
    graph = the_graph()
    assert "lengthgen.assembly.runs" in graph["lengthgen.training.trainer"]  # the parser sees the imports
    # the schema is plain data, at the bottom, beside the translation of earlier versions' keys (plain dicts),
    # the bundled presets' folder, and the rule that makes a plugin file's path absolute
    assert graph["lengthgen.config.schema"] <= {"lengthgen.errors", "lengthgen.config.upgrade", "lengthgen.config.presets",
                                                "lengthgen.plugins"}
    assert graph["lengthgen.config.upgrade"] == graph["lengthgen.config.presets"] == set()
    assert graph["lengthgen.plugins"] == graph["lengthgen.register"] == {"lengthgen.errors"}
    config = {t for m, targets in graph.items() if m.startswith("lengthgen.config.") for t in targets}
    assert config <= {"lengthgen.errors", "lengthgen.config.schema", "lengthgen.config.schedules", "lengthgen.plugins",
                      "lengthgen.config.dependence", "lengthgen.config.upgrade", "lengthgen.config.presets"}  # no registry
    assert [m for m in graph if layer(m) is None and m.count(".") > 0 and graph[m]] == []


def test_no_module_imports_a_layer_above_it():
    assert layer_violations(the_graph()) == []


def top_level_graph() -> dict[str, set[str]]:
    return {module_name(p): top_level_imports(p) for p in PACKAGE.rglob("*.py")}


def reporting_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in (PACKAGE / "reporting").glob("*.py")}


def test_reporting_loads_no_model_code():
    """A report reads result files: importing reporting loads neither the model stack nor the task
    registry; only the two drawings made from a run's checkpoint or corpus load them, when drawn."""
    assert reporting_loads_beyond_results(top_level_graph()) == []
    assert the_graph()["lengthgen.results.rows"] <= {"lengthgen.errors", "lengthgen.config.schema"}  # the bounds of a row
    assert loads_model_code_when_called(reporting_sources()) == DRAWN_FROM_A_RUN


def test_a_planted_model_import_in_reporting_fails():
    graph = top_level_graph()
    graph["lengthgen.reporting.series"] = graph["lengthgen.reporting.series"] | {"lengthgen.tasks"}
    assert "lengthgen.tasks" in reporting_loads_beyond_results(graph)
    sources = reporting_sources()
    sources["series.py"] += "\n\ndef task_names():\n    from lengthgen.tasks import TASKS\n    return list(TASKS)\n"
    assert loads_model_code_when_called(sources) - DRAWN_FROM_A_RUN == {("series.py", "task_names")}


def test_importing_every_module_leaves_the_compiler_unloaded():
    """torch._dynamo takes 2.6 s to import (as long as torch itself): every command, script and
    worker process would pay it, and only compiled runs need it (accel/compiling.py loads it)."""
    modules = sorted(module_name(p) for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(k for k in sys.modules if k.startswith(('torch._dynamo', 'torch._inductor'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def looped_imports_of_evaluation(graph: dict[str, set[str]]) -> list[str]:
    """The evaluation modules' imports of the looped methods (at the top or inside a function)."""
    return sorted(f"{module} imports {target}" for module, targets in graph.items()
                  if module.startswith("lengthgen.evaluation") for target in targets
                  if target == LOOPED or target.startswith(LOOPED + "."))


def test_the_evaluator_imports_nothing_from_the_looped_methods():
    assert looped_imports_of_evaluation(the_graph()) == []


def test_a_planted_looped_import_in_the_evaluator_fails():
    graph = the_graph()
    graph["lengthgen.evaluation.evaluate"] = graph["lengthgen.evaluation.evaluate"] | {f"{LOOPED}.stop_rules"}
    assert looped_imports_of_evaluation(graph) == [f"lengthgen.evaluation.evaluate imports {LOOPED}.stop_rules"]


ACCEL = "lengthgen.accel"
# the layers the fast paths sit on: they depend on these, and none of these may depend on them
BELOW_ACCEL = ("lengthgen.model", "lengthgen.methods", "lengthgen.tasks", "lengthgen.config", "lengthgen.runtime")


def imports_of_accel_from_below(graph: dict[str, set[str]]) -> list[str]:
    """The model's (and the layers under the fast paths') imports of lengthgen.accel, at the top or
    inside a function: the model holds the math, and a fast path extends it from above."""
    return sorted(f"{module} imports {target}" for module, targets in graph.items()
                  if module.startswith(BELOW_ACCEL) for target in targets
                  if target == ACCEL or target.startswith(ACCEL + "."))


def test_the_model_imports_nothing_from_the_fast_paths():
    assert imports_of_accel_from_below(the_graph()) == []
    private = [str(p.relative_to(PACKAGE.parent)) for p in (PACKAGE / "model").rglob("*.py")
               if "torch._C" in p.read_text()]
    assert private == []  # no private torch API in the model


def test_a_planted_accel_import_in_the_model_fails():
    graph = the_graph()
    graph["lengthgen.model.attention"] = graph["lengthgen.model.attention"] | {f"{ACCEL}.narrow_attention"}
    assert imports_of_accel_from_below(graph) == [f"lengthgen.model.attention imports {ACCEL}.narrow_attention"]
    assert f"lengthgen.model.attention imports {ACCEL}.narrow_attention, a layer above it" in layer_violations(graph)


def test_the_import_graph_has_no_cycle():
    assert cycle(the_graph()) is None


def test_the_code_that_runs_configs_grids_and_reports_names_no_paper_task_or_method():
    for file in NO_NAMES:
        named = names_in((PACKAGE / file).read_text())
        assert not named, f"lengthgen/{file} names {sorted(named)}"


def test_validation_names_no_scheme_or_transform_either():
    """Each variant checks its own settings (`check` on tasks, methods and schemes; attributes of
    transforms and schemes), so validation asks capabilities, never names."""
    for file in ("config/checks.py", "assembly/runs.py", "assembly/checks.py"):
        named = names_in((PACKAGE / file).read_text(), variants=True)
        assert not named, f"lengthgen/{file} names {sorted(named)}"



# the config's sections, and the hooks a variant implements: each implementation reads what it needs
# (NTPLoop.build_model reads task and model, a curriculum schedule train and task), so they take it whole
SECTIONS = {f.name for f in dataclasses.fields(Config)}  # from the schema: a new section is covered
HOOKS = {"build_model", "finish", "check", "decay_start", "rate"}


def whole_config_for_one_section(source: str) -> list[str]:
    """Functions that take the whole config (`cfg` or `config`), read one section of it, and never hand
    it on: they should take that section."""
    found = []
    for cls_or_fn in ast.walk(ast.parse(source)):
        body = cls_or_fn.body if isinstance(cls_or_fn, (ast.Module, ast.ClassDef)) else []
        for fn in (node for node in body if isinstance(node, ast.FunctionDef)):
            if isinstance(cls_or_fn, ast.ClassDef) and fn.name in HOOKS:
                continue
            for arg in (a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg in ("cfg", "config")):
                read = [n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name) and n.value.id == arg]
                named = sum(isinstance(n, ast.Name) and n.id == arg for n in ast.walk(fn))
                if named == len(read) and len(set(read)) == 1 and set(read) <= SECTIONS:
                    found.append(f"{fn.name} reads only {arg}.{read[0]}")
    return found


def test_a_function_receives_the_section_it_reads():
    """Sections belong to their components: a function reading one section takes that section, not
    the whole config (the assembled run and the checks that compare sections take it whole)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        found = whole_config_for_one_section(path.read_text())
        assert not found, f"{path.relative_to(PACKAGE.parent)}: {found}"
    planted = "def steps_left(cfg, step):\n    return cfg.train.steps - step\n"
    assert whole_config_for_one_section(planted) == ["steps_left reads only cfg.train"]
    handed_on = "def total(cfg):\n    return cfg.train.steps + other(cfg)\n"
    assert whole_config_for_one_section(handed_on) == []

@pytest.mark.parametrize("module, target", [("lengthgen.model.transformer", "lengthgen.reporting.report"),
                                            ("lengthgen.config.checks", "lengthgen.assembly.checks"),
                                            ("lengthgen.runtime.checkpoint", "lengthgen.assembly.runs"),
                                            ("lengthgen.assembly.runs", "lengthgen.evaluation.evaluate"),
                                            ("lengthgen.training.trainer", "lengthgen.evaluation.during_training"),
                                            ("lengthgen.tasks.copy", "lengthgen.training.trainer")])
def test_a_planted_import_from_above_fails(module, target):
    graph = the_graph()
    graph[module] = graph[module] | {target}
    assert layer_violations(graph) == [f"{module} imports {target}, a layer above it"]


def test_a_planted_cycle_and_a_planted_name_fail():
    graph = the_graph()
    graph["lengthgen.errors"] = {"lengthgen.cli"}
    assert cycle(graph) is not None
    validation = (PACKAGE / "assembly" / "checks.py").read_text()
    assert names_in(validation + '\n\ndef check_copy(cfg):\n    return cfg.task.name == "copy"\n') == {"copy"}
    planted = validation + '\n\ndef check_rope(cfg):\n    return cfg.model.position == "rope"\n'
    assert names_in(planted) == set() and names_in(planted, variants=True) == {"rope"}


def test_the_tests_mirror_the_package():
    """A test file sits in the folder of the layer it tests (tests/<subpackage>/); the files at the
    top test the whole (architecture, the shape of its functions, CLI, the Python API, plugins, examples,
    the wheel, golden runs, bad input, scripts); tests/helpers/ holds what they share."""
    layers = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    tests = PACKAGE.parent / "tests"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("__pycache__", "helpers")}
    assert folders <= layers, f"test folders without a layer: {sorted(folders - layers)}"
    assert layers - folders <= set(), f"layers without tests: {sorted(layers - folders)}"
    top = {p.name for p in tests.glob("test_*.py")}
    assert top == {"test_architecture.py", "test_bad_input.py", "test_benchmarks.py", "test_cli.py", "test_golden.py",
                   "test_scripts.py", "test_api.py", "test_plugins.py", "test_examples.py", "test_wheel.py",
                   "test_function_shape.py"}


def documented_layers(text: str) -> list[list[str]]:
    """The modules of each row of docs/architecture.md's layer table, top of the table first."""
    table = text.split("| layer | what it holds |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        cell = line.split("|")[1]
        rows.append(["lengthgen." + name.removesuffix(".py").removesuffix("/").replace("/", ".")
                     for name in re.findall(r"`([^`]+)`", cell)])
    return rows


def test_the_documented_layer_table_is_the_enforced_order():
    rows = documented_layers((PACKAGE.parent / "docs" / "architecture.md").read_text())
    assert rows == [[p for p in prefixes if p != "lengthgen.__main__"] for prefixes in LAYERS]
