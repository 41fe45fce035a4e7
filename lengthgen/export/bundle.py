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
    "lengthgen.model.narrow_attention": "narrow_attention",  # a stub, below
}
# bundled modules whose last name says too little in a flat folder
RENAMED = {"lengthgen.methods.looped.block": "looped_block"}
TEMPLATE = Path(__file__).with_name("modeling_lengthgen.py.in")

# lengthgen's C kernel for narrow heads is compiled from a .c file on first use; a Hugging Face
# folder carries no C source to compile, and SDPA computes the same attention to float tolerance
NARROW_STUB = '''"""Stands in for lengthgen's narrow-head attention kernel (C, compiled on first use): an exported
folder carries no C source, and SDPA computes the same attention to float tolerance."""


def applies(q, dropout_p=0.0):
    return False


def attend(q, k, v):
    raise NotImplementedError("the narrow-head kernel is not part of an export")
'''


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
    (`from lengthgen.model import narrow_attention`) as `from . import m`, with a `from .m import`
    line beside it, since the loader copies only the files named that way."""

    def replace(match: re.Match) -> str:
        indent, module, names = match.group(1), match.group(2), match.group(3)
        first = names.strip("( ").split(",")[0].split(" as ")[0].strip()
        if module not in REPLACED and is_module(f"{module}.{first}"):
            return (f"{indent}from . import {names}\n"
                    f"{indent}from .{first} import __name__ as _{first}_file  # noqa: F401 (the loader copies it)")
        return f"{indent}from .{flat_name(module)} import {names}"

    return re.sub(r"^([ \t]*)from (lengthgen[\w.]*) import ([^\n]+)", replace, source, flags=re.MULTILINE)


def sources() -> dict[str, str]:
    """{file name: text} of the bundled modelling code, the wrapper included."""
    todo, seen, files = list(ROOTS), set(), {}
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
    files.update({"lengthgen_config.py": model_config_source(), "narrow_attention.py": NARROW_STUB,
                  "task_base.py": rewrite(Path(import_module("lengthgen.tasks.base").__file__).read_text()),
                  "modeling_lengthgen.py": TEMPLATE.read_text(encoding="utf-8")})
    left = [n for n, text in files.items() if re.search(r"^\s*(from|import) lengthgen", text, re.MULTILINE)]
    if left:
        raise ValueError(f"bundled files still import lengthgen: {left}")
    return files


def write_sources(folder: Path) -> list[str]:
    """The modelling code written into `folder`; returns the file names."""
    files = sources()
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return sorted(files)
