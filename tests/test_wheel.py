"""lengthgen as pip installs it: the wheel built from the checkout, unpacked, used from a folder
outside the checkout with nothing else of lengthgen importable. It fails if a grid, a preset or a
file a command needs is missing from the wheel."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
EXPERIMENTS = CHECKOUT / "lengthgen" / "experiments"


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> Path:
    """The wheel, built with the project's own build backend (no download) and unpacked."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a clean copy: a checkout's own build/ may hold files of modules since moved
    shutil.copytree(CHECKOUT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "runs", "*.egg-info", "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(root / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (root / "dist").glob("lengthgen-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root / "site")
    return root / "site"


def lengthgen_cli(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}  # the unpacked wheel alone: not the checkout
    return subprocess.run([sys.executable, "-m", "lengthgen", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


@pytest.mark.slow
def test_the_wheel_carries_every_grid_and_preset(unpacked):
    shipped = {p.relative_to(unpacked / "lengthgen" / "experiments") for p in
               (unpacked / "lengthgen" / "experiments").rglob("*.toml")}
    in_checkout = {p.relative_to(EXPERIMENTS) for p in EXPERIMENTS.rglob("*.toml")}
    assert shipped == in_checkout and len(shipped) > 80
    assert {p.name for p in (unpacked / "lengthgen" / "export").iterdir()} >= {"modeling_lengthgen.py.in"}
    assert {p.name for p in (unpacked / "lengthgen" / "accel").iterdir()} >= {"narrow_attention.c"}


@pytest.mark.slow
def test_the_installed_commands_run_outside_the_checkout(unpacked, tmp_path):
    where = lengthgen_cli(unpacked, tmp_path, "--version")
    assert where.returncode == 0 and where.stdout.startswith("lengthgen ")
    code = "import lengthgen, sys; print(lengthgen.__file__)"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(unpacked)}).stdout
    assert imported.startswith(str(unpacked)), imported  # the wheel's copy, not the checkout's
    listed = lengthgen_cli(unpacked, tmp_path, "reproduce", "--list")
    assert listed.returncode == 0, listed.stderr
    papers = sorted(p.parent.name for p in EXPERIMENTS.glob("*/grid.toml"))
    assert [line.split(":")[0] for line in listed.stdout.splitlines() if not line.startswith((" ", "("))] == papers
    presets = lengthgen_cli(unpacked, tmp_path, "presets")
    assert presets.returncode == 0 and "looped/cpu/parity" in presets.stdout
    trained = lengthgen_cli(unpacked, tmp_path, "train", "looped/cpu/parity", "--set", "train.steps=3",
                            "--set", "train.log_interval=1", "--out", "runs/x", "--no-progress")
    assert trained.returncode == 0, trained.stderr
    assert (tmp_path / "runs" / "x" / "checkpoints").is_dir()
    assert "finished at step 3" in trained.stdout
