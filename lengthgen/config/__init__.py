"""Configuration: the schema of every key (schema.py) and presets loaded and validated (presets.py)."""
