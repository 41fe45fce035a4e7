"""The decoder's math: attention (attention.py: the dense path on SDPA, a scheme's own, the KV
cache), positional schemes (positions.py and a file per family), position-ID transforms, the
transformer, generation. Faster paths over it live in lengthgen.accel, which this package never
imports."""
