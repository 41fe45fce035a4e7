"""A run assembled once: its config checked once and each part built once, whatever checks read it."""
from __future__ import annotations

from pathlib import Path

import pytest

from lengthgen import assembly
from lengthgen.config.schema import to_dict
from lengthgen.methods.registry import METHODS
from lengthgen.tasks import TASKS

ROOT = Path(__file__).resolve().parents[2] / "experiments"
PPC = ("sparsity/cpu/addition_mixed.toml", ["method=ppc", "task.options.coupled=true", "model.position=learned",
                                             "train.position_transform=random_offset",
                                             "train.position_transform_options.keep_zero=true",
                                             "train.position_transform_options.max_position=40"])
LOOPED = ("looped/cpu/parity.toml", [])


def counted(monkeypatch, registry: dict, counts: dict, key: str) -> None:
    """Count the constructions of every class of `registry` (once per instance, however many
    constructors of its bases run)."""
    depth = [0]

    def wrap(cls):
        original = cls.__dict__["__init__"]

        def init(self, *args, **kwargs):
            counts[key] += depth[0] == 0
            depth[0] += 1
            try:
                original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        init.__wrapped__ = original  # the options checks read the constructor's signature
        monkeypatch.setattr(cls, "__init__", init)

    for cls in {base for c in registry.values() for base in c.__mro__[:-1] if "__init__" in base.__dict__}:
        wrap(cls)


@pytest.mark.parametrize("preset, sets", [PPC, LOOPED], ids=["coupled-ppc", "looped"])
def test_an_assembled_run_builds_its_task_and_method_once(monkeypatch, preset, sets):
    counts = {"task": 0, "method": 0}
    counted(monkeypatch, TASKS, counts, "task")
    counted(monkeypatch, METHODS, counts, "method")
    run = assembly.assemble(ROOT / preset, sets)
    assert counts == {"task": 1, "method": 1}
    assert run.task.name == run.cfg.task.name and run.method.name == run.cfg.method
    counts.update(task=0, method=0)
    assembly.assemble_saved(to_dict(run.cfg))  # a saved run: checked and built once too
    assert counts == {"task": 1, "method": 1}


def test_a_saved_run_gets_no_default_and_a_new_one_does():
    run = assembly.assemble(ROOT / PPC[0], PPC[1])
    assert run.cfg.model.position_options == {"std": assembly.GIVEN_IDS_TABLE_STD}
    data = to_dict(run.cfg)
    data["model"]["position_options"] = {}
    assert assembly.assemble_saved(data).cfg.model.position_options == {}
