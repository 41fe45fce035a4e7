"""Where a run lives: its device, memory and disk, its folder and checkpoints."""
