"""A benchmark's results as a JSON record: benchmarks/records/YYYY-MM-DD-<script>-<machine>.json.

<script> is the script's file name without its extension (unique across benchmarks/), <machine>
a short name of the device it measured: the GPU's name (nvidia-h200) or, on a CPU,
cpu<cores>-<model> (cpu2-amd-epyc). A second record of the same script, machine and day gets -2,
-3, ... before .json: nothing is overwritten. Each record holds the script, the date, the
command line, the parsed arguments, the machine (platform, CPU model and count, load average,
torch and its threads, the GPU), a note on what else ran (--note), the commit, and the results.

Every script takes `--json PATH` (a file, or a folder to put the dated record in; default
benchmarks/records/), `--no-record` and `--note TEXT`. This module imports no torch at import, so
the authors' scripts run it under their own Python environments.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

RECORDS = Path(__file__).resolve().parent.parent / "records"
ROOT = RECORDS.parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("record")
    group.add_argument("--json", metavar="PATH", help="write the results here (a folder: the dated record in it); "
                       "default: benchmarks/records/YYYY-MM-DD-<script>-<machine>.json")
    group.add_argument("--no-record", action="store_true", help="print only, write no JSON")
    group.add_argument("--note", default="", help="what else ran on the machine, or why this run was made")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def gpu_name(load: bool = False) -> str | None:
    """The GPU's name; None without one, or where torch is not loaded and `load` is False (a script
    that never loaded torch measured no GPU in this process)."""
    torch = sys.modules.get("torch")
    if torch is None and load:
        try:
            import torch
        except ImportError:
            return None
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return None


def machine_name(device: str | None = None) -> str:
    """The <machine> of a record's name: the GPU's where the script measured one, else the CPU's."""
    gpu = gpu_name(load=str(device).startswith("cuda")) if device is None or str(device).startswith("cuda") else None
    if gpu:
        return slug(gpu)
    model = re.sub(r"\(r\)|\(tm\)|\bprocessor\b|\bcpu\b|@.*", "", cpu_model().lower())
    return f"cpu{os.cpu_count()}-{'-'.join(slug(model).split('-')[:3]) or 'unknown'}"


def machine() -> dict:
    """What a record says of the machine it was made on."""
    about = {"platform": platform.platform(), "python": platform.python_version(), "cpu": cpu_model(),
             "cpu_count": os.cpu_count()}
    try:
        about["load_average"] = [round(x, 2) for x in os.getloadavg()]  # 1, 5, 15 minutes: what else ran
    except OSError:
        pass
    torch = sys.modules.get("torch")
    if torch is not None:
        about.update({"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "gpu": gpu_name(), "cuda": torch.version.cuda})
    else:  # the script ran torch in child processes only: the installed version, without loading it
        try:
            about["torch"] = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            pass
    return about


def commit() -> str | None:
    """The checkout's commit (the working tree may differ from it: the record's arguments say what ran)."""
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def record_path(script: str, where: str | Path | None = None, device: str | None = None,
                day: datetime.date | None = None) -> Path:
    """Where the record goes: `where` itself if it names a file, else the dated name in the
    folder `where` (default benchmarks/records/), -2, -3, ... added where one exists."""
    where = Path(where) if where else RECORDS
    if where.suffix == ".json" and not where.is_dir():
        return where
    stem = f"{(day or datetime.date.today()).isoformat()}-{Path(script).stem}-{machine_name(device)}"
    path, n = where / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = where / f"{stem}-{n}.json"
    return path


def write(script: str, args: argparse.Namespace | None, results: dict, device: str | None = None) -> Path | None:
    """Write the record of `results` as args say (--json, --no-record, --note); returns its path."""
    if args is not None and getattr(args, "no_record", False):
        return None
    path = record_path(script, getattr(args, "json", None), device)
    shown = {k: v for k, v in vars(args).items() if k not in ("json", "no_record", "note")} if args else {}
    script_path = Path(script).resolve()
    record = {"script": str(script_path.relative_to(ROOT)) if script_path.is_relative_to(ROOT) else str(script),
              "date": datetime.date.today().isoformat(), "argv": sys.argv[1:], "args": shown,
              "note": getattr(args, "note", "") if args else "", "machine": machine(), "commit": commit(),
              "results": results}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"record: {path}", file=sys.stderr)
    return path
