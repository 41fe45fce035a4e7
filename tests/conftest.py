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
