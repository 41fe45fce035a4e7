"""The registries of lengthgen's parts, and the decorators that fill them:

    @lengthgen.register.scheme("half_rope")
    class HalfRoPE(lengthgen.PositionalScheme): ...

Five kinds of part are named in a config, each by a registry here: positional schemes
(`model.position`), tasks (`task.name`), methods (`method`), stop rules (`--stop`, `tests.stops`)
and position transforms (`data.position_transform`). Built-ins and plugins enter them the same
way, through `Registry.add` (the built-in tables call it in the order listings show them); a
plugin's part is then checked, planned into grids, reported and exported as a built-in one is.
A name is held once: a second class under a held name is refused in one line naming the holder,
unless it is the same definition again (a module or notebook cell run twice replaces it).

Each registry is filled by its home module (`lengthgen.model.positions` for schemes, ...), which
sets the base class every entry must subclass before it registers them. A plugin that registers
before the home has run imports it first, so a clash with a built-in is refused when the plugin is
imported, not later. This module
sits at the bottom of the import graph: the homes are imported by name when a plugin registers.
"""
from __future__ import annotations

import importlib
import re
import sys

from lengthgen.errors import PluginError

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")  # a name a config, a --set and a folder name can spell


def origin(cls: type) -> str:
    """Where a registered class comes from: `the built-in lengthgen.model.rotary.RoPE`, or the
    plugin's module (a plugin file by its path)."""
    module = sys.modules.get(cls.__module__)
    if cls.__module__.startswith("lengthgen."):
        return f"the built-in {cls.__module__}.{cls.__qualname__}"
    where = getattr(module, "__lengthgen_plugin__", None) or cls.__module__
    return f"{cls.__qualname__} of plugin {where}"


class Registry(dict):
    """name -> class for one kind of part. `kind`: what it holds (in messages); `key`: the config key
    that names an entry; `home`: the module that registers the built-ins and sets `base`."""

    def __init__(self, kind: str, key: str, home: str):
        super().__init__()
        self.kind, self.key, self.home = kind, key, home
        self.base: type | None = None  # set by the home module

    def register(self, name: str):
        """A class decorator: `@SCHEMES.register("half_rope")` adds the class under `name`."""
        def add(cls):
            self.add(name, cls)
            return cls
        return add

    def add(self, name: str, cls: type) -> None:
        """`cls` under `name`; PluginError (one line) for a bad name, a class that is not a subclass
        of the base, or a name another class holds."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise PluginError(f"{self.kind} name {name!r} must be letters, digits and . _ + - (it names folders)")
        if self.base is None:  # the home has not run: the built-ins first, so a clash with one is refused now
            importlib.import_module(self.home)
        if self.base is not None and not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise PluginError(f"{self.kind} {name!r}: {getattr(cls, '__qualname__', cls)!r} must subclass "
                              f"lengthgen.{self.base.__name__}")
        held = self.get(name)
        if held is not None and (held.__module__, held.__qualname__) != (cls.__module__, cls.__qualname__):
            raise PluginError(f"{self.kind} name {name!r} is already held by {origin(held)}; register "
                              f"{cls.__qualname__} under another name")
        if "name" in vars(self.base or object) or hasattr(cls, "name"):
            cls.name = name  # tasks, methods, rules and transforms report the name they run under
        self[name] = cls

    def unknown(self) -> str:
        """The end of the message for a name no entry holds: where a plugin's name would come from."""
        return (f"; a plugin's {self.kind} is loaded with --plugin MODULE_OR_FILE, or the config's "
                "plugins = [...]")


SCHEMES = Registry("positional scheme", "model.position", "lengthgen.model.positions")
TASKS = Registry("task", "task.name", "lengthgen.tasks")
METHODS = Registry("method", "method", "lengthgen.methods.registry")
STOP_RULES = Registry("stop rule", "--stop", "lengthgen.methods.looped.stop_rules")
TRANSFORMS = Registry("position transform", "data.position_transform", "lengthgen.model.position_transforms")


def scheme(name: str):
    """Register a positional scheme (a `lengthgen.PositionalScheme` subclass): `model.position = name`.
    Its keyword arguments after `cfg` are its options (`model.position_options`)."""
    return SCHEMES.register(name)


def task(name: str):
    """Register a task (a `lengthgen.Task` subclass): `task.name = name`; its keyword arguments are
    its options (`task.options`)."""
    return TASKS.register(name)


def method(name: str):
    """Register a method (a `lengthgen.Method` subclass): `method = name`; its keyword arguments
    after `cfg` are its options (`method_options`)."""
    return METHODS.register(name)


def stop_rule(name: str):
    """Register a stop rule of looped models (a `lengthgen.StopRule` subclass): `--stop name[:args]`."""
    return STOP_RULES.register(name)


def transform(name: str):
    """Register a position transform (a `lengthgen.PositionTransform` subclass):
    `data.position_transform = name`; its keyword arguments are its options."""
    return TRANSFORMS.register(name)
