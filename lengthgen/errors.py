"""Errors the CLI reports as one line and a non-zero exit code, without a traceback."""
import stat
from pathlib import Path


class UserError(Exception):
    """Bad input from the user: exit code 2, nothing written."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """A bad config key or value; the message names the key."""


class PluginError(ConfigError):
    """A plugin that cannot be imported, or a part it registers under a name already held; the
    message names the plugin (its module or file) and the first line of its error."""


class TrainingDiverged(Exception):
    """The loss became NaN or inf; the last good checkpoint is kept. Exit code 1."""

    exit_code = 1


class ResourceError(Exception):
    """The machine cannot serve the run (memory, disk, a folder it cannot write); the message
    names the resource and what to change, and the last complete checkpoint is kept. Exit code 1."""

    exit_code = 1


class RunsFailed(Exception):
    """Some runs of a reproduction failed: the report of the others is written (`report`, None
    when no run is left to report), each failure is in failures.txt. Exit code 1."""

    exit_code = 1

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


def first_line(err: BaseException, limit: int = 160) -> str:
    """An error's first line (its type's name if it has no text), cut to `limit` characters: what a
    one-line note quotes of an error it recovers from."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:limit]


def path_problem(path, want: str = "file") -> str:
    """Why `path` is not the `want` ("file" or "folder") a command needs, said as what it is:
    "does not exist", "is a folder, not a file", "is a FIFO, not a file" (a FIFO or /dev/zero
    exists: "does not exist" would send the user looking for the wrong fault)."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        return f"is a symbolic link to {path.readlink()}, which does not exist"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return f"is {kind}, not a {want}"
