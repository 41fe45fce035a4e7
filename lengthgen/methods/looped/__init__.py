"""Looped Transformers: the block, the looped methods, their stop rules, the passes they read, the halting heads."""
