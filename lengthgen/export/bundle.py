"""The modelling code an export carries: lengthgen's own model source files, copied beside a thin
Hugging Face wrapper (modeling_lengthgen.py) with their imports rewritten to relative ones, so an
exported folder loads with `transformers` alone: no lengthgen, and no second implementation of the
model that could drift from the one that trained it (docs/export.md).

Hugging Face's dynamic-module loader copies a remote-code file and, recursively, every file it
names in a `from .x import y` line (transformers.dynamic_module_utils.get_relative_imports), into
one flat folder: so every bundled file is flat, named by its module's last part, and every import
of a bundled module is written in that form.
"""
from __future__ import annotations

import ast
import inspect
import re
import sys
from importlib import import_module
from pathlib import Path

from lengthgen.config.schema import ModelConfig

# where the bundle starts: the decoder and the looped block; everything they import is followed
ROOTS = ("lengthgen.model.transformer", "lengthgen.methods.looped.block")
# modules the bundle replaces with a file of its own -> that file
REPLACED = {
    "lengthgen.config.schema": "lengthgen_config",  # ModelConfig alone: the rest of the schema is training's
    "lengthgen.tasks": "task_base",  # the package imports every task; the model needs the Batch layout only
    "lengthgen.tasks.base": "task_base",
}
# bundled modules whose last name says too little in a flat folder
RENAMED = {"lengthgen.methods.looped.block": "looped_block"}
TEMPLATE = Path(__file__).with_name("modeling_lengthgen.py.in")

def model_config_source() -> str:
    """lengthgen_config.py: the ModelConfig dataclass as the run's lengthgen defines it."""
    return ('"""lengthgen\'s ModelConfig (lengthgen/config/schema.py), copied by `lengthgen export`."""\n'
            "from __future__ import annotations\n\nfrom dataclasses import dataclass, field\n\n\n"
            + inspect.getsource(ModelConfig))


def lengthgen_imports(source: str) -> set[str]:
    """Every lengthgen module a source file imports (`from lengthgen.x import y`: x, or x.y where
    y is a module), at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lengthgen") and not node.level:
            if node.module in REPLACED:
                found.add(node.module)
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if is_module(sub) else node.module)
        elif isinstance(node, ast.Import) and any(a.name.startswith("lengthgen") for a in node.names):
            raise ValueError("`import lengthgen...` cannot be rewritten; use `from lengthgen.x import y`")
    return found


def is_module(name: str) -> bool:
    if name in REPLACED:
        return True
    try:
        import_module(name)
        return True
    except ImportError:
        return False


def flat_name(module: str) -> str:
    return REPLACED.get(module) or RENAMED.get(module) or module.rsplit(".", 1)[-1]


def rewrite(source: str) -> str:
    """Each `from lengthgen.a.b import names` as `from .b import names`; an imported module
    (`from lengthgen.methods.looped import fixed_steps`) as `from . import m`, with a `from .m import`
    line beside it, since the loader copies only the files named that way."""

    def replace(match: re.Match) -> str:
        indent, module, names = match.group(1), match.group(2), match.group(3)
        first = names.strip("( ").split(",")[0].split(" as ")[0].strip()
        if module not in REPLACED and is_module(f"{module}.{first}"):
            return (f"{indent}from . import {names}\n"
                    f"{indent}from .{first} import __name__ as _{first}_file  # noqa: F401 (the loader copies it)")
        return f"{indent}from .{flat_name(module)} import {names}"

    return re.sub(r"^([ \t]*)from (lengthgen[\w.]*) import ([^\n]+)", replace, source, flags=re.MULTILINE)


def sources(scheme: type | None = None) -> dict[str, str]:
    """{file name: text} of the bundled modelling code, the wrapper included; with a plugin's `scheme`
    (a class registered outside lengthgen), its file too, imported by the wrapper (plugin_files)."""
    todo, seen, files = list(ROOTS), set(), {}
    extra, needed = plugin_files(scheme) if scheme is not None and not is_builtin(scheme) else ({}, set())
    todo += sorted(needed)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module in REPLACED:
            continue
        text = Path(import_module(module).__file__).read_text(encoding="utf-8")
        todo += sorted(lengthgen_imports(text))
        name = flat_name(module) + ".py"
        if name in files:
            raise ValueError(f"two bundled modules are both named {name}")
        files[name] = rewrite(text)
    files.update({"lengthgen_config.py": model_config_source(),
                  "task_base.py": rewrite(Path(import_module("lengthgen.tasks.base").__file__).read_text()),
                  "modeling_lengthgen.py": TEMPLATE.read_text(encoding="utf-8")})
    for name, text in extra.items():  # the plugin's file, and the wrapper importing it so that it registers
        files[name] = text
        if name.startswith(PLUGIN_PREFIX):
            files["modeling_lengthgen.py"] = with_import(files["modeling_lengthgen.py"], name[:-3])
    left = [n for n, text in files.items() if re.search(r"^\s*(from|import) lengthgen", text, re.MULTILINE)]
    if left:
        raise ValueError(f"bundled files still import lengthgen: {left}")
    return files


def write_sources(folder: Path, scheme: type | None = None) -> list[str]:
    """The modelling code written into `folder` (with a plugin `scheme`'s file); returns the file names."""
    files = sources(scheme)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return sorted(files)


# A positional scheme from a plugin (lengthgen.plugins) travels as its own file, `plugin_<stem>.py`,
# its lengthgen imports made relative: `from lengthgen import ...` and `import lengthgen` read the
# names a plugin uses from `lengthgen_api.py`, whose `register.scheme` fills the bundled registry
# (the other kinds register what trains or evaluates a run, which an export does not carry).
PLUGIN_PREFIX = "plugin_"
PLUGIN_API = '''"""The names a plugin imports from lengthgen, as an export carries them: the scheme's base class,
the bundled registry's `register.scheme`, and stand-ins for what only trains or evaluates a run."""
from . import register as _register
from .register import __name__ as _register_file  # noqa: F401 (the loader copies it)
from .scheme_base import PositionalScheme  # noqa: F401
from .task_base import Batch, Task  # noqa: F401


class NotExported:
    """A base class whose subclasses an export does not run (methods, stop rules, transforms)."""


Method = StopRule = PositionTransform = NotExported


class register:
    """`@register.scheme(name)` registers into the bundled table; the other kinds are not exported."""
    scheme = staticmethod(_register.scheme)

    @staticmethod
    def _not_exported(name):
        return lambda cls: cls

    task = method = stop_rule = transform = _not_exported
'''
# what a plugin file may import to travel in an export: the standard library, torch, numpy and the
# lengthgen modules the bundle carries (the model, the config's ModelConfig, the tasks' Batch)
CARRIED = ("lengthgen.model.", "lengthgen.register")


def is_builtin(scheme: type) -> bool:
    return scheme.__module__.startswith("lengthgen.")


def plugin_files(scheme: type) -> tuple[dict[str, str], set[str]]:
    """({file name: text}, the lengthgen modules it needs) for a plugin scheme: its module's file
    rewritten, and lengthgen_api.py. UserError (one line) where it cannot travel: no single file, or
    an import an export cannot carry."""
    from lengthgen.errors import UserError
    from lengthgen.plugins import source_file

    path = source_file(scheme.__module__)
    what = f"model.position's plugin scheme {scheme.__qualname__}"
    if path is None or path.suffix != ".py" or path.name == "__init__.py":
        raise UserError(f"export cannot bundle {what}: it is not defined in a single .py file "
                        f"(module {scheme.__module__}); define the scheme in one file to export it")
    text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if isinstance(node, ast.ImportFrom) and node.level:
            raise UserError(f"export cannot bundle {what} ({path}): it imports relatively "
                            f"(from {'.' * node.level}{node.module or ''}); an export carries one plugin file")
        for name in names:
            top = name.split(".")[0]
            carried = name == "lengthgen" or name.startswith(CARRIED) or name in REPLACED
            if (top == "lengthgen" and not carried) or (top != "lengthgen" and top not in CARRIED_TOPS):
                raise UserError(f"export cannot bundle {what} ({path}): it imports {name}, which an exported folder "
                                "cannot carry (the standard library, torch, numpy and lengthgen's model)")
    top_level = r"^[ \t]*(from lengthgen import [^\n]+|import lengthgen[ \t]*)$"
    needed = lengthgen_imports(re.sub(top_level, "", text, flags=re.MULTILINE))  # what the plugin reads of the model
    text = re.sub(r"^([ \t]*)from lengthgen import ", r"\1from .lengthgen_api import ", text, flags=re.MULTILINE)
    text = re.sub(r"^([ \t]*)import lengthgen[ \t]*$",
                  r"\1from . import lengthgen_api as lengthgen\n\1from .lengthgen_api import __name__ as _api_file",
                  text, flags=re.MULTILINE)
    if re.search(r"^\s*import lengthgen", text, re.MULTILINE):
        raise UserError(f"export cannot bundle {what} ({path}): write `import lengthgen` or `from lengthgen.x import y`, "
                        "not `import lengthgen.x`")
    return {f"{PLUGIN_PREFIX}{path.stem.replace('-', '_')}.py": rewrite(text), "lengthgen_api.py": PLUGIN_API}, needed


CARRIED_TOPS = set(sys.stdlib_module_names) | {"torch", "numpy", "lengthgen"}


def with_import(wrapper: str, module: str) -> str:
    """The wrapper's text with `from .<module> import ...` after its last relative import: importing
    the plugin registers its scheme before a model is built (the loader copies the file it names)."""
    lines = wrapper.split("\n")
    last = max(i for i, line in enumerate(lines) if line.startswith("from ."))
    lines.insert(last + 1, f"from .{module} import __name__ as _{module}  # noqa: F401 (registers its scheme)")
    return "\n".join(lines)
