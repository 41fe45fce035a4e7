"""The local Ray instance the Ray backend's tests share within a test file."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the module (it takes seconds to start); reproduce uses it
    rather than starting its own, and leaves it running."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
