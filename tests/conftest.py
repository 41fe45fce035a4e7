import os
import sys

import pytest
import torch

# Tiny models run fastest on one thread, and a shared 2-core machine stays responsive.
torch.set_num_threads(1)
# Ray starts its workers at nice 15: beside two busy processes they got so little of the CPU that
# importing torch in one took 49-74 s, and a toy grid on Ray 99 s instead of 6 (2 cores, 2026-12-07).
# Inherited by the Ray instances that tests start, in this process or in a subprocess.
os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_collection_modifyitems(items):
    """Test files with the most slow tests first (a stable sort: the rest keep their order), so
    that the workers of `make test` (one test file each at a time) start with the long files and
    end on short ones, not one worker finishing a long file while the other waits. Run with
    --no-loadscope-reorder, which keeps this order (by default pytest-xdist puts the files with
    the most tests first, and the long ones have few)."""
    slow = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's float comparisons, whatever a run before it set."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture
def registries():
    """The registries as they were before the test: the parts a test's plugins registered are removed
    after it, and its plugin modules forgotten, so the next test that names them imports them again
    (tests share worker processes: a scheme left registered would show in another file's listings)."""
    from lengthgen import api, plugins, register

    tables = [register.SCHEMES, register.TASKS, register.METHODS, register.STOP_RULES, register.TRANSFORMS]
    api.load_config(None, ["task.name=copy"])  # every home imported: the built-ins are in
    saved, loaded = [dict(t) for t in tables], dict(plugins._loaded)
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)
    for spec in set(plugins._loaded) - set(loaded):
        sys.modules.pop(getattr(plugins._loaded[spec], "__name__", ""), None)
    plugins._loaded.clear()
    plugins._loaded.update(loaded)

