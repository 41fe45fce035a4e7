"""Training: the trainer, data-parallel ranks, trackers, finite training sets."""
