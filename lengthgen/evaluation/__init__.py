"""Evaluation: exact match per length, perplexity and per-token losses, dependence sparsity, tests during training."""
