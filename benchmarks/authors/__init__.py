"""The authors' released code run at lengthgen's budgets (benchmarks/README.md)."""
