"""Evaluation: exact match per length (evaluate.py, its options as one object in settings.py),
perplexity and per-token losses, dependence sparsity, position scaling, tests during training."""
