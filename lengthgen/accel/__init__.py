"""Fast paths: the same arithmetic as the model and the trainer, run faster.

- backends.py: faster kernels for the model's dense attention (installed here, on import)
- narrow_attention.py (+ .c): causal attention for heads <= 8 wide on CPU, in C
- onednn_linear.py: the blocks' fp32 linear layers on oneDNN where MKL leaves AVX-512 unused (installed on import)
- heap.py: glibc's heap kept between the steps of a CPU training or evaluation process
- compiling.py: torch.compile of the blocks, and of a fixed-shape step whole; its cache folder
- captured.py: training steps recorded as CUDA graphs, one per shape bucket
- stacked.py: seeds of one config stacked into one model under vmap
- hook.py: `FastPaths`, the one object through which the trainer reaches all of the above

Nothing below this package imports it (tests/test_architecture.py): the model holds the math, and
each path here is checked equal to it in tests/accel/.
"""
from lengthgen.accel import backends, onednn_linear

backends.install()
onednn_linear.install()
