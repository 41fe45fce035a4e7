"""lengthgen: train small transformers on short inputs, test them on long ones."""
import os

# OpenMP threads that spin while they wait hold a core that another job needs: on a 2-core machine
# running one other CPU-bound job, a run with 2 spinning torch threads took 6-8 s per step where
# 1 thread took 0.7 s, and 2 threads that sleep while they wait 0.4 s (benchmarks/threads.py).
# The policy is read once, when torch loads OpenMP, so it is set here, before any torch import;
# a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
