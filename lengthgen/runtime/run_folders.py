"""What lengthgen writes, recognised before anything is deleted or overwritten, and read back
whole or with what is damaged named.

`--force` deletes a folder only if it is a lengthgen run: a `config.toml` with a
lengthgen config's sections and nothing but the files a run, its evaluation and
a report write (RUN_NAMES), and never the current folder or one that holds it.
A report or a reproduction overwrites report.md, results.csv and timing.csv only
where lengthgen wrote them (recognised by their first lines). Every command that writes a folder
holds its lock (run_lock, a file beside the folder) while it writes: one `train`, `export`, `report`
or `reproduce` at a time, or `eval`s side by side (their rows merged under a lock of their own), so a
second writer is refused in one line naming the first and nothing is mixed.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import shlex
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from lengthgen.config.schema import Config
from lengthgen.errors import ResourceError, UserError

# Everything a run folder may hold: training (config, metrics, checkpoints, a BPE tokenizer, the
# trackers' folders), evaluation (eval.csv and what sits beside it) and a report written into it.
RUN_NAMES = {"config.toml", "metrics.jsonl", "checkpoints", "tokenizer.json", "tensorboard", "wandb",
             "series.json", "eval.csv", "eval.csv.unreadable", "eval.done", "per_step.csv", "position_loss.csv",
             "token_loss.csv", "dependence.csv", "token_eval.json", "report.md", "results.csv"}
CHECKPOINT_NAME = re.compile(r"step_\d{8}|latest")
SECTIONS = {f.name for f in fields(Config)}  # a lengthgen config's top-level keys
# What a training killed before its first checkpoint leaves: no result, so it may start afresh.
UNSTARTED = {"config.toml", "metrics.jsonl", "checkpoints", "series.json", "tensorboard", "wandb"}
# The first line of each file a report or a reproduction writes, as lengthgen writes it.
OWN_FIRST_LINES = {"results.csv": re.compile(r"run,task,method,"), "timing.csv": re.compile(r"run,ok,seconds$")}
REPORT_MARK = "Every number below is rebuilt from those rows."  # a line of every report.md
EVAL_LOCK = ".eval.lock"  # inside the folder eval.csv is written to, while rows are merged
EXPORT_MARK = "lengthgen_export.json"  # written last into a folder of `lengthgen export` (runtime/exported.py)


def _temporary(name: str) -> bool:  # an atomic write's leftover, .<name>.tmp, or a held lock
    return name.startswith(".") and (name.endswith(".tmp") or name == EVAL_LOCK)


def foreign(folder: Path) -> str | None:
    """Why `folder` is not a lengthgen run (an entry no run writes, or no lengthgen config.toml), or None."""
    for entry in sorted(folder.iterdir()):
        if not (entry.name in RUN_NAMES or _temporary(entry.name) or entry.suffix == ".png"):
            return f"it holds {entry.name}, which no run writes"
    checkpoints = folder / "checkpoints"
    if checkpoints.is_dir():
        for entry in sorted(checkpoints.iterdir()):
            if not (CHECKPOINT_NAME.fullmatch(entry.name) or _temporary(entry.name)):
                return f"it holds checkpoints/{entry.name}, which no run writes"
    if not (folder / "config.toml").exists():
        return "it has no config.toml"
    if not lengthgen_config(folder / "config.toml"):
        return "its config.toml is not a lengthgen config"
    return None


def lengthgen_config(path: Path) -> bool:
    """Whether `path` reads as a lengthgen config: TOML with a [task] and only a config's sections."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # missing, unreadable, not UTF-8, not TOML or nested past reading
        return False
    return "task" in data and set(data) <= SECTIONS


def check_deletable(folder: Path) -> None:
    """Refuse, in one line naming `folder` and why, to delete anything but a lengthgen run."""
    folder = Path(folder)
    if folder.is_symlink():
        raise UserError(f"--force does not delete {folder}: it is a symbolic link, not a run folder")
    here, target = Path.cwd().resolve(), folder.resolve()
    if target == here or target in here.parents:
        raise UserError(f"--force does not delete {folder}: it is the current folder or holds it")
    why = foreign(folder)
    if why is not None:
        raise UserError(f"--force deletes only a lengthgen run, and {folder} is not one ({why}); "
                        "move it away or give another --out")


def unstarted(folder: Path) -> bool:
    """`folder` is missing, or a run stopped before its first checkpoint: only what UNSTARTED
    names, no complete checkpoint (checkpoint.save writes into hidden .tmp folders first)."""
    folder = Path(folder)
    if not folder.exists():
        return True
    if any(p.name not in UNSTARTED for p in folder.iterdir()):
        return False
    checkpoints = folder / "checkpoints"
    return not checkpoints.exists() or all(_temporary(p.name) for p in checkpoints.iterdir())


def written_by_lengthgen(path: Path) -> bool:
    """`path` (report.md, results.csv, timing.csv, failures.txt) is one lengthgen wrote."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return False
    if path.name == "report.md":
        return REPORT_MARK in text
    if path.name == "failures.txt":  # written with timing.csv, always: it vouches for both
        return written_by_lengthgen(path.with_name("timing.csv"))
    return bool(OWN_FIRST_LINES[path.name].match(text.split("\n", 1)[0]))


def check_overwritable(out: Path, names: tuple[str, ...]) -> None:
    """Refuse to write into `out` if it holds one of `names` that lengthgen did not write."""
    for name in names:
        path = Path(out) / name
        if path.exists() and not written_by_lengthgen(path):
            raise UserError(f"{path} is not one lengthgen wrote (or it is damaged); not overwriting it: "
                            "move it away or give another --out")


def check_writable(folder: Path, hint: str) -> None:
    """Make `folder` if needed and write a file in it, or refuse in one line with `hint` (what to do):
    before a long job rather than after it (permission bits alone do not tell, e.g. for root)."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ResourceError(f"cannot write into {folder}: {err.strerror or err}; {hint}") from None


def check_eval_out(out: Path, run: Path) -> None:
    """`eval --out`: a new or empty folder, or one holding an evaluation of this same run."""
    if not out.exists() or not any(out.iterdir()):
        return
    mine, theirs = run / "config.toml", out / "config.toml"
    if foreign(out) is not None or not theirs.is_file() or theirs.read_bytes() != mine.read_bytes():
        raise UserError(f"--out {out} holds files other than an evaluation of {run}; give a new or empty folder")


def check_reproduction_out(out: Path) -> None:
    """A reproduction's --out is new or a folder of its own: never a run folder or an export, whose
    own rows `lengthgen report OUT` would then mix with the reproduction's runs."""
    out = Path(out)
    if (out / EXPORT_MARK).is_file():
        raise UserError(f"--out {out} is a folder of `lengthgen export`; give a folder of its own for the reproduction")
    held = [name for name, found in (("checkpoints", (out / "checkpoints").is_dir()), ("eval.csv", (out / "eval.csv").is_file()),
                                     ("config.toml", lengthgen_config(out / "config.toml"))) if found]
    if held:
        raise UserError(f"--out {out} is a run folder (it holds {held[0]}): a report of it would mix that run's "
                        "rows with the reproduction's; give a folder of its own")


def holder_line() -> str:
    """`pid N: lengthgen train ...`: who holds a lock, for the one line that refuses a second writer."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("lengthgen", "__main__.py"):
        argv[0] = "lengthgen"
    return f"pid {os.getpid()}: {shlex.join(argv)}"


class FolderLock:
    """A lock (flock) on the file `path` for as long as a command writes what it guards: one
    writer at a time (exclusive), or readers beside each other but never beside a writer
    (`shared`). It refuses at once with one line naming the holders (pid and command), or, with
    `wait`, waits up to that many seconds (a short merge). The file is removed on release by the
    last holder; a process that locked a file removed meanwhile sees another inode at `path` and
    tries again, so two processes never hold two files of one name. On NFS, Linux maps flock to a
    POSIX lock that the server keeps."""

    def __init__(self, path: Path, what: str, shared: bool = False, wait: float = 0.0,
                 advice: str = "wait for it to finish"):
        self.path, self.what, self.shared, self.wait, self.advice = Path(path), what, shared, wait, advice

    def __enter__(self) -> "FolderLock":
        deadline = time.monotonic() + self.wait
        mode = fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        while True:
            try:
                file = open(self.path, "a+")
            except OSError as err:
                if not self.shared:  # a writer that cannot make its lock file cannot write beside it either
                    raise ResourceError(f"cannot write into {self.path.parent} for {self.what}: {err.strerror}; "
                                        "give a folder you can write (--out)") from None
                if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                self.file = None  # a reader of a run it cannot write (eval --out) reads it unlocked, as
                return self  # nothing of this user's can write it either
            try:
                fcntl.flock(file, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                holders = self.holders(file)
                file.close()
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise UserError(f"{self.what} is in use by {holders}; {self.advice}") from None
            if self.same_file(file):
                break
            file.close()  # removed by its last holder between our open and our lock: take the new one
        self.file = file
        if not self.shared:  # the one holder: a killed holder's line goes
            file.truncate(0)
        file.write(f"{holder_line()}\n")  # appended: shared holders each add their line
        file.flush()
        return self

    def same_file(self, file) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(file.fileno()).st_ino
        except FileNotFoundError:
            return False

    def holders(self, file) -> str:
        """The holders' lines whose process still runs (a shared lock's file keeps finished readers' lines)."""
        file.seek(0)
        lines = [line for line in file.read().splitlines() if line.strip()]
        alive = [line for line in lines if pid_alive(line)]
        return "; ".join(alive or lines) or "another lengthgen process"

    def __exit__(self, *exc) -> None:
        if self.file is None:
            return
        try:  # the last holder removes the file: only it can take the lock exclusively
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if self.same_file(self.file):
                self.path.unlink(missing_ok=True)
        except (BlockingIOError, OSError):
            pass
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def pid_alive(line: str) -> bool:
    found = re.match(r"pid (\d+):", line)
    if not found:
        return True
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


def run_lock(folder: Path, shared: bool = False, what: str | None = None,
             advice: str = "wait for it to finish") -> FolderLock:
    """The lock of one folder a command writes, held by `train` (exclusive: from before the folder
    is made until it ends; --force and --resume take it first), `eval` (shared), and `export`,
    `report` and `reproduce` on their --out (exclusive, OutLock). Its file sits beside the folder,
    `.<name>.lock`, so deleting, making or replacing the folder never touches it, and every command
    writing one folder meets the same file. `what` names the folder in the refusal."""
    folder = Path(folder).resolve()  # a run reached through a symbolic link is locked as itself
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ResourceError(f"cannot make folder {folder.parent}: {err.strerror}; give a folder you can write (--out)") from None
    return FolderLock(folder.parent / f".{folder.name}.lock", what or f"run folder {folder}", shared, advice=advice)


def rows_lock(out: Path) -> FolderLock:
    """Held while an evaluation merges its rows into OUT/eval.csv: two evaluations of one run keep
    both sets of rows. A merge takes well under a second; another's is waited for."""
    return FolderLock(Path(out) / EVAL_LOCK, f"{Path(out) / 'eval.csv'}", wait=120.0)


def OutLock(out: Path) -> FolderLock:
    """The lock on the --out of `export`, `report` or `reproduce` for as long as it writes there: the
    run lock of that folder, so a second writer of any kind (a reproduction, a report, an export, a
    training) stops with one line instead of mixing its files with the first one's."""
    return run_lock(out, what=f"--out {out}", advice="wait for it to finish or give another --out")
