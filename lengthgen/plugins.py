"""Plugins: modules of the user's that register parts (lengthgen.register) before a run is assembled.

A plugin is named as a module (`my_pkg.schemes`, imported as Python imports it, the current folder
included, as `python -m` would) or as a Python file (`path/to/half_rope.py`, or any name with a `/`).
Three places name them: a config's top-level `plugins = [...]` (a file relative to the preset that
names it), `--plugin` on every command, and installed packages' entry points in the group
`lengthgen.plugins` (each loaded in every process, once). A run folder's config.toml records the
plugins its run used, files as absolute paths, so that `eval`, `--resume`, `report`, `export` and
a reproduction's worker processes (spawned, or on Ray) import them before they assemble anything.

Loading is idempotent: a module or file already loaded is not imported again. Every failure is one
line naming the plugin (PluginError, exit 2): one that cannot be imported, with the first line of its
error, and a part registered under a name already held.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from lengthgen.errors import PluginError, first_line, path_problem

GROUP = "lengthgen.plugins"  # the entry-point group installed packages declare plugins in
_loaded: dict[str, object] = {}  # spec (module name or absolute path) -> module
_installed: list[str] | None = None


def is_file(spec: str) -> bool:
    """Whether a plugin is named by its file rather than as a module."""
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def resolved(spec: str, base: Path | None = None) -> str:
    """A plugin as a run folder records it: a file as an absolute path (relative to `base`, the
    folder of the preset that names it, else the current folder), a module name as given."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"a plugin is a module name or a .py file, got {spec!r}")
    spec = spec.strip()
    if not is_file(spec):
        return spec
    path = Path(spec).expanduser()
    return str((path if path.is_absolute() else (base or Path.cwd()) / path).resolve())


def load(specs=(), where: str = "") -> list[str]:
    """Import each plugin in `specs` (and every installed one), once per process; returns the specs
    as resolved. `where`: what named them, for the message (e.g. " (recorded in RUN/config.toml)")."""
    load_installed()
    done = []
    for spec in specs:
        spec = resolved(spec)
        if spec not in _loaded:
            _loaded[spec] = import_plugin(spec, where)
        done.append(spec)
    return done


def import_plugin(spec: str, where: str = ""):
    """The plugin's module, imported; PluginError naming it on any failure."""
    if is_file(spec) and not Path(spec).is_file():
        raise PluginError(f"plugin {spec}{where} {path_problem(spec, 'Python file')}")
    try:
        return import_file(Path(spec)) if is_file(spec) else import_module(spec)
    except PluginError as err:  # a name already held, a class of the wrong base: raised as it registered
        raise PluginError(f"plugin {spec}{where}: {err}") from None
    except Exception as err:  # noqa: BLE001 (any error of the user's module, said in one line)
        raise PluginError(f"plugin {spec}{where} cannot be imported: {type(err).__name__}: {first_line(err)}") from None


def import_module(name: str):
    """A module plugin, found as `python -m` finds modules: on sys.path and in the current folder."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # appended: an installed module of the same name wins
    return importlib.import_module(name)


def import_file(path: Path):
    """A file plugin as a module of its own, named by its path (one file, one module, however named)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"lengthgen_plugin_{path.stem.replace('-', '_')}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__lengthgen_plugin__ = str(path)  # what messages call it (lengthgen.register.origin)
    sys.modules[name] = module  # before it runs: its classes' __module__ must resolve (pickling, dataclasses)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_installed() -> list[str]:
    """Every plugin installed packages declare in the `lengthgen.plugins` entry-point group, once per process."""
    global _installed
    if _installed is None:
        from importlib.metadata import entry_points

        _installed = []
        for point in entry_points(group=GROUP):
            _installed.append(point.value)
            if point.value not in _loaded:
                try:
                    _loaded[point.value] = point.load()
                except PluginError as err:
                    raise PluginError(f"plugin {point.value} (entry point {point.name} of {GROUP}): {err}") from None
                except Exception as err:  # noqa: BLE001
                    raise PluginError(f"plugin {point.value} (entry point {point.name} of {GROUP}) cannot be "
                                      f"imported: {type(err).__name__}: {first_line(err)}") from None
    return _installed


def source_file(module_name: str) -> Path | None:
    """The file a loaded plugin module was read from (None for one without a file)."""
    module = sys.modules.get(module_name)
    path = getattr(module, "__lengthgen_plugin__", None) or getattr(module, "__file__", None)
    return Path(path) if path else None
