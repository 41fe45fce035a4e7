"""A trained and evaluated toy run, shared by the fault tests that damage or limit it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lengthgen.cli import main
from tests.helpers.tiny_runs import train_cli
from tests.helpers.toy_papers import positions_grid, toy_paper, toy_preset


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A trained and evaluated toy run, copied by the tests that damage it."""
    folder = tmp_path_factory.mktemp("faults") / "run"
    assert train_cli(folder) == 0 and main(["eval", str(folder), "--no-progress"]) == 0
    return folder


@pytest.fixture
def copy(run, tmp_path) -> Path:
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture
def toy(tmp_path) -> Path:
    """A folder holding a toy paper (a positions grid on Parity, 40 steps), for the kill tests."""
    toy_paper(tmp_path / "toy", positions_grid("Faults"), {"parity": toy_preset(steps=40, lengths="2,4,8", samples=32)})
    return tmp_path
