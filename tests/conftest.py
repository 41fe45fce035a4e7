import sys
from pathlib import Path

import pytest
import torch

# Tiny models run fastest on one thread, and a shared 2-core machine stays responsive.
torch.set_num_threads(1)


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
