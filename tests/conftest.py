import sys
from pathlib import Path

import pytest
import torch

# Tiny models run fastest on one thread, and a shared 2-core machine stays responsive.
torch.set_num_threads(1)


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


# The helpers beside this file (tiny_runs, toy_papers, golden, task_checks, preset_tables) are
# imported by name from the test files in the subfolders, which mirror the package's layers.
sys.path.insert(0, str(Path(__file__).resolve().parent))
