"""`lengthgen` calls in a subprocess under the machine's limits, for the tests that make a fault
happen for real: an address-space limit (memory runs out), a file-size limit (a full disk: writes
fail with EFBIG), and for root the two
capabilities that let it write where permission bits say no dropped (an unwritable folder). Each
call's exit code and stderr come back; a traceback is reported as the code "traceback"."""
from __future__ import annotations

import ctypes
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

# the driver runs several CLI calls in one process (one torch import) and prints each call's exit
# code and stderr as JSON on its last line: stdout is a pipe, which no file-size limit stops
DRIVER = r"""
import contextlib, io, json, sys, traceback
from lengthgen.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        except BaseException:
            code = "traceback"
            err.write(traceback.format_exc())
    results.append([code, err.getvalue()])
print("\n" + json.dumps(results))
"""
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, PR_CAPBSET_DROP = 1, 2, 24


def limited(memory: int = 0, file_size: int = 0, unprivileged: bool = False):
    """A preexec_fn: address-space and file-size limits, and for root the capabilities that bypass
    permission bits dropped from the bounding set (so gone after exec)."""
    def apply():
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if file_size:  # Python ignores SIGXFSZ: a write past the limit fails with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        if unprivileged and os.geteuid() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
                if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    return apply


def calls(argvs: list[list[str]], cwd: Path, **limits) -> list[tuple[object, str]]:
    """(exit code, stderr) of each `lengthgen` call, run in one subprocess under `limits`."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(argvs)], cwd=cwd, capture_output=True,
                          text=True, preexec_fn=limited(**limits), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [tuple(r) for r in json.loads(proc.stdout.rstrip().rsplit("\n", 1)[-1])]


def permission_bits_bind(tmp_path: Path) -> bool:
    """Whether a process started with `limited(unprivileged=True)` is stopped by a read-only folder."""
    folder = tmp_path / "probe"
    folder.mkdir(mode=0o555)
    try:
        touched = subprocess.run(["touch", str(folder / "x")], capture_output=True,
                                 preexec_fn=limited(unprivileged=True))
    except OSError:  # root without CAP_SETPCAP: cannot drop the capabilities
        return False
    finally:
        (folder / "x").unlink(missing_ok=True)
        folder.chmod(0o755)
    return touched.returncode != 0
