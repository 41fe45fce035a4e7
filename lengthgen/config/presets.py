"""The presets and grids that ship inside the package (lengthgen/experiments/; a checkout links
experiments/ to it), found by name: `looped/cpu/parity` is lengthgen/experiments/looped/cpu/parity.toml.

A preset is named by its path under experiments/ with or without `.toml`; a path a command is given
that exists is read as it is, so a user's own preset of the same name wins. `lengthgen presets`
lists them by paper, scale and task.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
GRID = "grid.toml"


@dataclass(frozen=True)
class Preset:
    paper: str  # the folder under experiments/: a grid's (looped) or the single-run presets' (core)
    scale: str  # cpu or paper; "" for a preset outside a scale folder
    task: str  # the file's stem
    path: Path

    @property
    def name(self) -> str:
        """What `lengthgen train` takes: looped/cpu/parity."""
        return self.path.relative_to(EXPERIMENTS).with_suffix("").as_posix()


def bundled() -> list[Preset]:
    """Every bundled preset (grids aside), sorted by paper, scale and task."""
    found = []
    for path in sorted(EXPERIMENTS.rglob("*.toml")):
        if path.name == GRID:
            continue
        parts = path.relative_to(EXPERIMENTS).parts
        found.append(Preset(parts[0], parts[1] if len(parts) > 2 else "", path.stem, path))
    return found


def bundled_path(name: str | Path) -> Path | None:
    """The bundled preset `name` names (looped/cpu/parity, looped/cpu/parity.toml, or
    experiments/looped/cpu/parity.toml as the docs spell it in a checkout), or None."""
    text = Path(name).as_posix()
    text = text[len("experiments/"):] if text.startswith("experiments/") else text
    if not text or text.startswith("/") or ".." in Path(text).parts:
        return None
    for candidate in (EXPERIMENTS / text, EXPERIMENTS / f"{text}.toml"):
        if candidate.suffix == ".toml" and candidate.is_file() and candidate.name != GRID:
            return candidate
    return None


def preset_path(name: str | Path) -> Path:
    """The file a preset argument names: the path itself where it is a file, else the bundled
    preset of that name; else the path as given (whose reading then says what is wrong with it)."""
    path = Path(name)
    if path.is_file():
        return path
    return bundled_path(name) or path
