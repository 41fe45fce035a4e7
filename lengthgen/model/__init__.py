"""The decoder: attention, positional schemes, position-ID transforms, the transformer, generation."""
