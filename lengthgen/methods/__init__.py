"""Training and inference methods, a module per family (next_token.py, ppc.py, encoder.py, recurrent.py,
looped/), their base (base.py) and the `METHODS` registry that names them (registry.py)."""
