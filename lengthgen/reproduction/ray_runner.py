"""`lengthgen reproduce PAPER --backend ray [--address ADDRESS]`: every run of a grid as a Ray task.

Each task is the job the local process pool runs (`jobs.run_job`: train, resume or
skip, then evaluate; it never raises), so the guarantees are the same: a finished run is
skipped, an interrupted one resumes from its checkpoint, a failing one is reported without
stopping the others, and the report is written once every run is done. Without an address
a local Ray instance is started (and stopped at the end); `--address auto` or
`ray://HEAD:10001` joins a running cluster.

Resources: a run that trains on CUDA (train.device cuda or cuda:N, or auto on a cluster
that has GPUs) asks for `--gpus-per-job` GPUs (default 1; 0.5 packs two small models on one
GPU) and 1 CPU; any other run asks for as many CPUs as its torch threads (`--threads`, by
default this machine's cores shared among `--workers`, as in the local pool).

Every node writes run folders under `--out`, so `--out` must be a path that every node
reaches at the same name (a shared filesystem); the grid's presets are copied to
OUT/presets, so the nodes need lengthgen installed but not the grid's folder. A run that
finished on its node but whose folder is not visible here is reported as failed, naming
that requirement. A node that dies mid-run is retried by Ray (up to 3 times), and the retry
resumes from the run's last checkpoint.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from tqdm.auto import tqdm

from lengthgen.errors import ResourceError, UserError
from lengthgen.reproduction.grid import Job

RAY_MISSING = "--backend ray needs Ray: pip install 'lengthgen[ray]'"
RETRIES = 3  # of a run whose worker or node died (Ray's default, stated here)
# what ray.init takes: auto, local, or [ray://]HOST:PORT (a host name, an IPv4 address or a bracketed IPv6 one)
ADDRESS = re.compile(r"auto|local|(?:ray://)?(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                     r":(?P<port>[0-9]{1,5})")
# a head node answers a TCP connection in milliseconds; Ray's own client retries for minutes
# (over 400 s at 127.0.0.1:1) before it gives up, so the head is tried once first, for this long
CONNECT_TIMEOUT = 10.0


def check_address(address: str) -> None:
    """UserError for an address of the wrong form, ResourceError for a head that does not answer
    within CONNECT_TIMEOUT seconds; `auto` and `local` are left to Ray (it finds or starts one)."""
    found = ADDRESS.fullmatch(address)
    if found is None or (found["port"] is not None and not 1 <= int(found["port"]) <= 65535):
        raise UserError(f"--address {address!r} is not a Ray address: give auto, HOST:PORT or ray://HOST:PORT")
    if found["host"] is None:
        return
    try:
        socket.create_connection((found["host"].strip("[]"), int(found["port"])), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:  # refused, unreachable, unknown host, timed out
        reason = err.strerror or str(err) or type(err).__name__
        raise ResourceError(f"Cannot reach the Ray cluster at {address} ({reason}): start its head "
                            "(ray start --head) or check --address") from None


def require():
    """The ray module, or a one-line UserError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UserError(RAY_MISSING) from None
    return ray


def resources(device: str, threads: int, cluster_gpus: float, gpus_per_job: float | None) -> dict:
    """The Ray resource request of a run whose train.device is `device`."""
    on_gpu = device.startswith("cuda") or (device == "auto" and cluster_gpus > 0)
    if on_gpu and gpus_per_job != 0:
        return {"num_gpus": 1 if gpus_per_job is None else gpus_per_job, "num_cpus": 1}
    return {"num_gpus": 0, "num_cpus": threads}


def shipped(jobs: list[Job], out: Path) -> list[Job]:
    """The jobs as a node runs them: absolute folders, and presets copied to OUT/presets (one per task)."""
    presets = out.resolve() / "presets"
    presets.mkdir(parents=True, exist_ok=True)
    copies = {}
    for job in jobs:
        if job.preset not in copies:
            copies[job.preset] = presets / f"{job.task}.toml"
            shutil.copyfile(job.preset, copies[job.preset])
    return [dataclasses.replace(job, preset=str(copies[job.preset]), folder=str(Path(job.folder).resolve()))
            for job in jobs]


def failure(job: Job, seconds: float, error: str, detail: str = "") -> dict:
    return {"folder": job.folder, "ok": False, "seconds": seconds, "error": error, "traceback": detail or error}


def session_folder(ray) -> Path | None:
    """The session folder (logs, sockets, spilled objects) of the local Ray instance this process
    started, under Ray's temp folder ($RAY_TMPDIR, else $TMPDIR/ray or /tmp/ray); None where this Ray
    does not say (the attribute is Ray's own, not public)."""
    try:
        return Path(ray._private.worker._global_node.get_session_dir_path())
    except (AttributeError, TypeError):
        return None


def remove_session(session: Path) -> None:
    """Remove the session folder of a local instance once it is shut down (Ray leaves one per run in
    the temp folder, and nothing clears them), with Ray's `session_latest` link if it names it."""
    shutil.rmtree(session, ignore_errors=True)
    latest = session.parent / "session_latest"
    if latest.is_symlink() and Path(os.readlink(latest)).name == session.name:
        latest.unlink(missing_ok=True)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run_on_ray(run_job, jobs: list[Job], out: Path, address: str | None, progress: bool,
               gpus_per_job: float | None, retries: int = RETRIES) -> list[dict]:
    """run_job for every job as a Ray task; the results in the order they finish, each naming
    its job's folder as given. A task whose worker dies is run again up to `retries` times."""
    ray = require()
    started = not ray.is_initialized()
    if started:
        # a local instance without a dashboard starts faster; a cluster keeps its own settings
        try:
            ray.init(address=address, **({} if address else {"include_dashboard": False}))
        except ConnectionError as err:  # no cluster where `auto` looked, a head that went away
            text = str(err).strip().splitlines()
            raise ResourceError(f"Cannot reach the Ray cluster at {address or 'a new local instance'}"
                                f"{': ' + text[0] if text else ''}") from None
    session = session_folder(ray) if started and not address else None  # a local instance of ours
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    pending = {}
    results, start = [], time.perf_counter()
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        task = ray.remote(run_job)
        for job, remote_job in zip(jobs, shipped(jobs, out)):
            request = resources(job.loaded().train.device, job.threads, gpus, gpus_per_job)
            pending[task.options(max_retries=retries, **request).remote(remote_job)] = (job, time.perf_counter())
        with tqdm(total=len(pending), desc="runs", disable=not progress) as bar:
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                job, submitted = pending.pop(ref)
                try:
                    result = {**ray.get(ref), "folder": job.folder}
                except ray.exceptions.RayError as err:  # its worker or node died, after Ray's retries
                    text = str(err).strip().splitlines()
                    result = failure(job, time.perf_counter() - submitted,
                                     f"{type(err).__name__}: {text[0] if text else ''}", str(err))
                if result["ok"] and not (Path(job.folder) / "eval.done").is_file():
                    result = failure(job, result["seconds"], f"the run finished on its node, but {job.folder} is not "
                                     "visible here: --out must be on a filesystem every node shares")
                results.append(result)
                if not result["ok"]:
                    tqdm.write(f"run {job.folder} failed: {result['error']}", file=sys.stderr)
                bar.update(1)
    except BaseException:
        for ref in pending:  # at once: finished runs are on disk, an unfinished one resumes next time
            ray.cancel(ref, force=True)
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if started:
            ray.shutdown()
        if session is not None:
            remove_session(session)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results)} runs done on Ray in {time.perf_counter() - start:.0f} s of wall time ({failed} failed)",
          file=sys.stderr)
    return results
