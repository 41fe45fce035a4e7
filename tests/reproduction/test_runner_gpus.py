"""Local reproductions on a GPU machine: how many workers by default, and which GPU each takes."""

import multiprocessing
import os

from lengthgen.reproduction import runner


def test_workers_per_gpu_as_measured_and_two_on_cpus():
    assert runner.default_workers(0) == runner.CPU_WORKERS == 2
    assert runner.default_workers(1, captured=True) == 1  # a recorded step keeps the GPU busy
    assert runner.default_workers(1, captured=False) == 4  # eager steps leave it idle: four share it
    assert runner.default_workers(3, captured=False) == 12


def test_workers_take_the_gpus_in_turn(monkeypatch):
    monkeypatch.setattr(runner, "_exit_with", lambda parent: None)
    counter, seen = multiprocessing.get_context("spawn").Value("i", 0), []
    for _ in range(5):
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        runner._start_worker(os.getpid(), 2, counter)
        seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert seen == ["0", "1", "0", "1", "0"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runner._start_worker(os.getpid(), 1, counter)  # one GPU: every worker sees it, nothing set
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


class FakeJob:
    def __init__(self, device, method="looped", capture=True, shards=1):
        self.cfg = type("Cfg", (), {"method": method, "train": type("Train", (), {"device": device, "capture": capture}),
                                    "data": type("Data", (), {"shards": shards})})()

    def loaded(self):
        return self.cfg


def test_eager_runs_anywhere_in_the_grid_take_eager_workers():
    assert runner.all_captured([FakeJob("auto"), FakeJob("auto", "ntp")])
    assert not runner.all_captured([FakeJob("auto"), FakeJob("auto", "ntp-pause")])
    assert not runner.all_captured([FakeJob("auto", capture=False)])
    assert not runner.all_captured([FakeJob("auto", shards=2)])


def test_runs_on_the_cpu_use_no_gpu(monkeypatch):
    monkeypatch.setattr(runner, "machine_gpus", lambda: 2)
    assert runner.gpus_used([FakeJob("auto"), FakeJob("cuda")]) == 2
    assert runner.gpus_used([FakeJob("auto"), FakeJob("cpu")]) == 0
