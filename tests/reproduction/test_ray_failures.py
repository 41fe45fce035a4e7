"""The Ray backend's failed runs: a worker that crashes, and a run that finished on a node whose
folders this machine does not see (a file of its own, so that the test workers share the long
Ray tests out)."""
from __future__ import annotations

from pathlib import Path

import pytest

from lengthgen.reproduction.grid import Job
from lengthgen.reproduction.ray_runner import run_on_ray
from test_ray_backend import PRESET


@pytest.mark.slow
def test_a_crashed_worker_or_an_unshared_folder_is_a_failed_run(tmp_path, ray_instance):
    preset = tmp_path / "parity.toml"
    preset.write_text(PRESET)
    jobs = [Job("parity", arm, 0, str(preset), [], str(tmp_path / "out" / "runs" / arm), threads=1)
            for arm in ("elsewhere", "crash")]

    def finished_on_another_node(job):  # reports success, but nothing reaches this machine's --out
        if job.arm == "crash":
            import os
            os._exit(1)
        return {"folder": job.folder, "ok": True, "seconds": 0.1, "skipped": False}

    # no retries: each would start a worker only to crash it again (Ray's loop, not lengthgen's)
    results = {Path(r["folder"]).name: r for r in
               run_on_ray(finished_on_another_node, jobs, tmp_path / "out", None, False, None, retries=0)}
    assert not results["elsewhere"]["ok"] and "every node shares" in results["elsewhere"]["error"]
    assert not results["crash"]["ok"] and "Worker" in results["crash"]["error"]
    assert (tmp_path / "out" / "presets" / "parity.toml").read_text() == PRESET  # what the nodes read
