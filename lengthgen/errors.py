"""Errors the CLI reports as one line and a non-zero exit code, without a traceback."""


class UserError(Exception):
    """Bad input from the user: exit code 2, nothing written."""

    exit_code = 2


class ConfigError(UserError, ValueError):
    """A bad config key or value; the message names the key."""


class TrainingDiverged(Exception):
    """The loss became NaN or inf; the last good checkpoint is kept. Exit code 1."""

    exit_code = 1


class ResourceError(Exception):
    """The machine cannot serve the run (memory, disk, a folder it cannot write); the message
    names the resource and what to change, and the last complete checkpoint is kept. Exit code 1."""

    exit_code = 1
