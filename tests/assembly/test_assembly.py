"""A run assembled once: its config checked once and each part built once, whatever checks read it."""
from __future__ import annotations

from pathlib import Path

import pytest

from lengthgen.assembly import runs
from lengthgen.assembly.runs import GIVEN_IDS_TABLE_STD, new_run, saved_run
from lengthgen.config.schema import to_dict
from lengthgen.methods.registry import METHODS
from lengthgen.tasks import TASKS

ROOT = Path(__file__).resolve().parents[2] / "experiments"
PPC = ("sparsity/cpu/addition_mixed.toml", ["method=ppc", "task.options.coupled=true", "model.position=learned",
                                             "data.position_transform=random_offset",
                                             "data.position_transform_options.keep_zero=true",
                                             "data.position_transform_options.max_position=40"])
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
    run = new_run(ROOT / preset, sets)
    assert counts == {"task": 1, "method": 1}
    assert run.task.name == run.cfg.task.name and run.method.name == run.cfg.method
    counts.update(task=0, method=0)
    saved_run(to_dict(run.cfg))  # a saved run: checked and built once too
    assert counts == {"task": 1, "method": 1}


def test_a_saved_run_gets_no_default_and_a_new_one_does():
    run = new_run(ROOT / PPC[0], PPC[1])
    assert run.cfg.model.position_options == {"std": GIVEN_IDS_TABLE_STD}
    data = to_dict(run.cfg)
    data["model"]["position_options"] = {}
    assert saved_run(data).cfg.model.position_options == {}


def walk(argv: list[str]) -> list[tuple[str, str, bool]]:
    """(module, function, entered from another module) of every lengthgen call made by
    `lengthgen ARGV`, up to its first backward pass (imports left out)."""
    import sys

    from lengthgen import cli

    package = str(Path(runs.__file__).parents[2])
    calls = []

    def module_of(frame) -> str | None:
        name = frame.f_code.co_filename if frame else ""
        if not name.startswith(package):
            return None
        return name[len(package) + 1:].removesuffix(".py").removesuffix("/__init__").replace("/", ".")

    def record(frame, event, _):
        done = calls and calls[-1][:2] == ("lengthgen.training.trainer", "backward")
        if event == "call" and not done and frame.f_code.co_name != "<module>" and module_of(frame):
            calls.append((module_of(frame), frame.f_code.co_name, module_of(frame.f_back) != module_of(frame)))

    sys.setprofile(record)
    try:
        cli.main(argv)
    finally:
        sys.setprofile(None)
    return calls


def test_the_walk_from_train_to_the_first_step_assembles_once(tmp_path):
    """`lengthgen train PRESET`: the preset read, checked and built once, each part by one call; once
    training starts it never enters the assembly or the checks again (nothing re-validated or rebuilt)."""
    calls = walk(["train", str(ROOT / LOOPED[0]), "--out", str(tmp_path / "run"), "--set", "train.steps=1"])
    assert calls[-1][:2] == ("lengthgen.training.trainer", "backward")
    once = [("lengthgen.assembly.runs", "new_run"), ("lengthgen.config.schema", "read"),
            ("lengthgen.config.checks", "validate"), ("lengthgen.assembly.checks", "checked_parts"),
            ("lengthgen.tasks", "get_task"), ("lengthgen.methods.registry", "get_method"),
            ("lengthgen.model.positions", "build_scheme"), ("lengthgen.model.position_transforms", "build_transform"),
            ("lengthgen.assembly.runs", "training_positions"), ("lengthgen.training.trainer", "train")]
    counts = {step: sum(call[:2] == step for call in calls) for step in once}
    assert counts == dict.fromkeys(once, 1)
    start = [call[:2] for call in calls].index(("lengthgen.training.trainer", "train"))
    back = [call for call in calls[start:]
            if call[2] and (call[0].startswith("lengthgen.assembly.") or call[0] == "lengthgen.config.checks")]
    assert back == []
    entered = [call[0] for call in calls if call[2]]
    assert entered.index("lengthgen.assembly.runs") < entered.index("lengthgen.training.trainer")
