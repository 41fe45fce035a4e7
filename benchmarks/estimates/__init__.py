"""What a whole reproduction would cost (benchmarks/README.md)."""
