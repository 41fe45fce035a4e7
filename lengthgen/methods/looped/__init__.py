"""Looped Transformers: the block, its stop rules, the passes they read, the halting heads."""
