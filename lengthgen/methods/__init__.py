"""Training and inference methods: next-token prediction, PPC, and the looped block (looped/)."""
