import torch

# Tiny models run fastest on one thread, and a shared 2-core machine stays responsive.
torch.set_num_threads(1)
