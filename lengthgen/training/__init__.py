"""Training: the trainer (trainer.py; its fast paths reached through lengthgen.accel.hook), its
state (run_state.py), data-parallel ranks, trackers, finite training sets, and seeds trained as
one stacked model (stacked_seeds.py)."""
