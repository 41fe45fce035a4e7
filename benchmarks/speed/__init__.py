"""Measurements of what a step costs today (benchmarks/README.md)."""
